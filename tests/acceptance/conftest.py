"""The whole distributed stack, started as a user would start it, for the acceptance suite.

* the vLLM OpenAI server (CPU build) on the tiny test model, with entroloop's entropy tap and span
  exporter publishing to Kafka (configured only by ``ENTROLOOP_`` variables);
* ``entroloop gateway`` in front of it, with API keys for a client tenant and the admin tenant;
* ``entroloop worker`` (every Faust processor) on the real broker of ``scripts/services.sh``.

The sinks, the action runner and the report are run by the test itself, at the moments it needs
them (chDB opens one data folder per process: a sink and the action runner take turns). Every
child runs in its own process group and is killed in teardown, also when the test fails.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
import socket
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.acceptance.processes import Child, http_ok, light_python
from tests.integration import vllm_tiny_model
from tests.integration.conftest import kafka_bootstrap  # noqa: F401 - the fixture, shared with the integration tests

MODEL = "tiny"
ROUTE = "support"
CACHE = Path(os.environ.get("ENTROLOOP_CACHE_DIR", Path.home() / ".cache" / "entroloop"))
# Chat completions need a template; the tiny tokenizer has none.
CHAT_TEMPLATE = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
FORCED_REPEATS = 12  # max_tokens of the request whose answer breaks the compliance rule
PATTERN_REPEATS = 8  # the rule: this many of the forced token in a row


@dataclass
class Stack:
    work: Path
    logs: Path
    env: dict[str, str]  # the settings every entroloop process of the stack shares
    gateway_url: str
    vllm_url: str
    client_key: str
    admin_key: str
    word_token_ids: list[int]  # the tokens requests allow (``allowed_token_ids``): whole words
    forced_token_id: int  # the token a logit_bias forces into the answer that breaks the compliance rule
    forced_text: str
    children: list[Child] = field(default_factory=list)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _tiny_model() -> Path:
    """The tiny Llama of the vLLM tests, built once per version of its builder under ~/.cache/entroloop."""
    digest = hashlib.sha256(Path(vllm_tiny_model.__file__).read_bytes()).hexdigest()[:16]
    folder = CACHE / "acceptance" / f"tiny-llama-{digest}"
    if not (folder / "config.json").exists():
        partial = folder.with_name(folder.name + f".partial-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        vllm_tiny_model.build_tiny_llama(partial)
        shutil.rmtree(folder, ignore_errors=True)
        partial.rename(folder)
    return folder


def _vocabulary(model: Path) -> tuple[list[int], int, str]:
    """The tokens that are whole corpus words (" omega"), one of them, and ``FORCED_REPEATS`` of it as text.

    The random tiny model mostly writes ids past the small tokenizer's merges, which decode to
    nothing; requests restrict it to whole words (vLLM's ``allowed_token_ids``) so that its answers
    are text a user can read, correct and a compliance rule can match.
    """
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    words = set(vllm_tiny_model.CORPUS_WORDS)
    allowed = [i for i in range(len(tokenizer)) if (tok := tokenizer.convert_ids_to_tokens(i))
               and tok.startswith("\u0120") and tok[1:] in words]
    ids = tokenizer.encode(" omega", add_special_tokens=False)
    assert len(ids) == 1 and ids[0] in allowed, f"' omega' is not one word token of the tiny vocabulary: {ids}"
    return allowed, ids[0], tokenizer.decode(ids * FORCED_REPEATS)


@pytest.fixture(scope="module")
def stack(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:  # noqa: F811
    from entroloop.infra.kafka_topics import ensure_topics

    work = tmp_path_factory.mktemp("acceptance")
    logs = work / "logs"
    logs.mkdir()
    model = _tiny_model()
    word_ids, token_id, forced_text = _vocabulary(model)
    forced_word = forced_text.split()[0]
    (work / "chat_template.jinja").write_text(CHAT_TEMPLATE)
    prefix = f"acc{secrets.token_hex(5)}."
    ensure_topics(kafka_bootstrap, prefix, partitions=1)
    client_key, admin_key = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    gateway_port, vllm_port = _free_port(), _free_port()
    keys = work / "gateway-keys"
    keys.write_text(f"acme:{client_key}\nadmin:{admin_key}\n")
    base = {k: v for k, v in os.environ.items() if not k.startswith("ENTROLOOP_")}
    env = {
        **base,
        "ENTROLOOP_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "ENTROLOOP_TOPIC_PREFIX": prefix,
        "ENTROLOOP_PARTITIONS": "1",
        "ENTROLOOP_DATA_DIR": str(work / "data"),
        "ENTROLOOP_AUDIT_STORE": "local",
        "ENTROLOOP_PII_KEY": secrets.token_hex(32),  # one key: pseudonyms join across the processes
        # The compliance rule the suite breaks on purpose: a run of the forced token, which the
        # random tiny model never writes by itself.
        "ENTROLOOP_COMPLIANCE_PATTERNS": json.dumps([rf"(?:\s*{re.escape(forced_word)}){{{PATTERN_REPEATS}}}"]),
    }
    gateway_url, vllm_url = f"http://127.0.0.1:{gateway_port}", f"http://127.0.0.1:{vllm_port}"
    stack = Stack(work, logs, env, gateway_url, vllm_url, client_key, admin_key, word_ids, token_id,
                  forced_text)
    try:
        vllm_env = {**env, "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                    "ENTROLOOP_NODE_ID": "vllm-node", "ENTROLOOP_ENTROPY_TAP_ENABLED": "true",
                    "ENTROLOOP_ENTROPY_TAP_SINK": "publisher", "ENTROLOOP_OTEL_SPANS_ENABLED": "true",
                    "ENTROLOOP_PUBLISHER_SPOOL_DIR": str(work / "vllm-spool"), "OTEL_BSP_SCHEDULE_DELAY": "100"}
        # cwd outside the repository: vLLM loads entroloop's plugins through the installed entry points
        vllm = Child("vllm", [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                              "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(vllm_port),
                              "--dtype", "float32", "--enforce-eager", "--max-model-len", "256",
                              "--max-num-seqs", "4", "--seed", "0", "--chat-template", str(work / "chat_template.jinja"),
                              "--otlp-traces-endpoint", "http://127.0.0.1:9"], vllm_env, logs, cwd=work)
        stack.children.append(vllm)
        # the worker and the gateway start while vLLM boots
        worker = Child("worker", [light_python(), "-m", "entroloop.cli", "worker"],
                       {**env, "ENTROLOOP_DATA_DIR": str(work / "worker")}, logs)
        stack.children.append(worker)
        gateway = Child("gateway", [light_python(), "-m", "entroloop.cli", "gateway", "--upstream", vllm_url,
                                    "--port", str(gateway_port), "--engine", "vllm", "--log-level", "warning"],
                        {**env, "ENTROLOOP_NODE_ID": "gateway-node", "ENTROLOOP_GATEWAY_ROUTE": ROUTE,
                         "ENTROLOOP_GATEWAY_API_KEYS_FILE": str(keys)}, logs)
        stack.children.append(gateway)
        gateway.wait_until(http_ok(f"{gateway_url}/metrics"), 120, "ready (GET /metrics)")
        vllm.wait_until(http_ok(f"{vllm_url}/v1/models"), 600, "ready (GET /v1/models)")
        yield stack
    finally:
        for child in reversed(stack.children):
            child.stop()
        from tests.integration.conftest import delete_topics_with_prefix

        delete_topics_with_prefix(prefix)
