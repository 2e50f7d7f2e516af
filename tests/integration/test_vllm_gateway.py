"""The audit gateway in front of the real vLLM server (CPU build) on the tiny model.

vLLM runs with entroloop's two plugins, configured only by ``ENTROLOOP_`` variables: the entropy tap
(TokenEntropy, exact, per generated token) and the span exporter (vLLM's own ``llm_request`` span,
switched on by ``--otlp-traces-endpoint``, published as a Span record instead of sent over OTLP).
The gateway adds its Audit record and request Span. All four records of a request must share the
request id and the W3C trace id, and vLLM's span must be the child of the gateway's.
Runs in .venv-ml (vLLM, starlette, httpx, uvicorn, opentelemetry-sdk).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from entroloop.collectors.gateway.app import GatewayConfig, create_app
from entroloop.collectors.vllm.emit import read_frames
from starlette.testclient import TestClient

from entroloop.contract.records import Audit, Span, TokenEntropy
from entroloop.infra.pii import PiiRedactor
from tests.integration.vllm_tiny_model import build_tiny_llama

pytestmark = pytest.mark.vllm

MODEL = "tiny"
TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CLIENT_PARENT = "b7ad6b7169203331"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def vllm_server(tmp_path_factory):
    """``vllm`` OpenAI server with the tap and the span exporter writing frame files (no broker)."""
    work = tmp_path_factory.mktemp("vllm-gateway")
    model = build_tiny_llama(work / "model")
    port = _free_port()
    env = {
        **os.environ,
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "ENTROLOOP_KAFKA_BOOTSTRAP": "",
        "ENTROLOOP_DATA_DIR": str(work / "data"),
        "ENTROLOOP_NODE_ID": "vllm-node",
        "ENTROLOOP_ENTROPY_TAP_ENABLED": "true",
        "ENTROLOOP_ENTROPY_TAP_SINK": f"file:{work}/tokens-{{pid}}.bin",
        "ENTROLOOP_OTEL_SPANS_ENABLED": "true",
        "OTEL_BSP_SCHEDULE_DELAY": "100",  # export spans every 100 ms, not every 5 s
    }
    # nothing listens on the OTLP endpoint: it only switches vLLM's tracing on; entroloop's
    # provider (installed by the vllm.general_plugins entry point) receives the spans.
    cmd = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
           "--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
           "--enforce-eager", "--max-model-len", "256", "--max-num-seqs", "4", "--seed", "0",
           "--otlp-traces-endpoint", "http://127.0.0.1:9", "--enable-tokenizer-info-endpoint"]
    log_path = work / "server.log"
    with open(log_path, "wb") as log:
        # cwd outside the repo: a stale entroloop.egg-info there would hide the installed entry points
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 600
    try:
        while True:
            try:
                with urllib.request.urlopen(f"{url}/v1/models", timeout=2):
                    break
            except OSError:
                if process.poll() is not None or time.time() > deadline:
                    pytest.fail("vLLM server did not start:\n" + log_path.read_text()[-4000:], pytrace=False)
                time.sleep(1)
        yield url, work
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()


def _frames(folder: Path) -> list:
    return [record for path in sorted(folder.rglob("*.bin")) for record in read_frames(path)]


def test_audit_span_and_tap_entropy_share_request_and_trace_ids(vllm_server) -> None:
    url, work = vllm_server
    published: list = []
    config = GatewayConfig(upstream=url, engine="auto", node_id="gw", route="support")
    requests = [
        ({"model": MODEL, "prompt": "mail bob@example.org the hello world", "max_tokens": 5, "temperature": 0.0,
          "user": "bob"}, {"traceparent": f"00-{TRACE_ID}-{CLIENT_PARENT}-01", "X-Request-Id": "gw-req-1"}),
        ({"model": MODEL, "prompt": "one two three", "max_tokens": 9, "temperature": 0.0}, {}),
    ]
    answers = []
    with TestClient(create_app(config, published.append, PiiRedactor(b"k"))) as client:
        for body, headers in requests:
            answer = client.post("/v1/completions", json=body, headers=headers)
            assert answer.status_code == 200, answer.text
            answers.append(answer.json())
    audits = [r for r in published if isinstance(r, Audit)]
    gateway_spans = [r for r in published if isinstance(r, Span)]
    assert len(audits) == 2 and len(gateway_spans) == 2
    assert not any(isinstance(r, TokenEntropy) for r in published)  # vLLM: the tap ships the exact ones

    # the tap's and vLLM's records are written by the server processes: wait for them
    deadline = time.time() + 60
    while True:
        frames = _frames(work)
        tokens = {r.request_id: r for r in frames if isinstance(r, TokenEntropy)}
        engine_spans = {r.request_id: r for r in frames if isinstance(r, Span) and r.name == "llm_request"}
        if all(a.request_id in tokens and a.request_id in engine_spans for a in audits) or time.time() > deadline:
            break
        time.sleep(0.2)

    assert audits[0].request_id == "gw-req-1" and audits[0].trace_id == TRACE_ID
    assert "bob@example.org" not in audits[0].prompt and audits[0].redactions == {"email": 1}
    assert audits[0].engine_version.startswith("vllm ")
    assert audits[0].tokenizer_digest.startswith("sha256:")
    for audit, gateway_span, answer in zip(audits, gateway_spans, answers):
        generated = answer["usage"]["completion_tokens"]
        token_record = tokens[audit.request_id]
        engine_span = engine_spans[audit.request_id]
        assert audit.trace_id == gateway_span.trace_id == token_record.trace_id == engine_span.trace_id
        assert audit.request_id == gateway_span.request_id == token_record.request_id == engine_span.request_id
        assert engine_span.parent_span_id == gateway_span.span_id  # vLLM joined the gateway's trace
        assert token_record.approximate is False and token_record.n_tokens == generated
        assert engine_span.output_tokens == generated and engine_span.prompt_tokens == answer["usage"]["prompt_tokens"]
        for timing in (engine_span.ttft_s, engine_span.e2e_s, engine_span.queue_s, engine_span.prefill_s, engine_span.decode_s):
            assert timing is not None and 0 <= timing < 60
        assert engine_span.ttft_s <= engine_span.e2e_s <= gateway_span.e2e_s
        assert engine_span.node_id == "vllm-node"
    assert gateway_spans[0].parent_span_id == CLIENT_PARENT
