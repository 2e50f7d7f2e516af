"""Adapter routing through the real gateway into the real vLLM engine (CPU build, tiny model).

A LoRA adapter is registered (chDB + local WORM store), loaded into a running vLLM server through
the runtime LoRA API and made a canary at share 0.5 in ``adapter_status``. Clients name only the
base model; the gateway (``ENTROLOOP_GATEWAY_ADAPTER_ROUTING``) sends about half the users to the
adapter, vLLM serves those requests under the adapter's name, and the Audit records name it. After
``entroloop adapters rollback`` (status written, adapter unloaded) everything goes to the base model
within one refresh; and a gateway still holding the old state (ClickHouse unreachable) falls back to
the base model when vLLM answers 404 for the unloaded adapter, so no request fails.
Runs in .venv-ml (vLLM, peft, starlette, chDB).
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
from entroloop.collectors.gateway.app import GatewayConfig, create_app
from entroloop.collectors.gateway.routing import RoutingTable
from entroloop.training.actions import ActionLog
from entroloop.training.registry import AdapterRegistry
from starlette.testclient import TestClient

from entroloop.contract.records import Audit
from entroloop.contract.settings import Settings
from entroloop.infra.adapter_routing import AdapterRouting
from entroloop.infra.pii import PiiRedactor
from entroloop.infra.worm.worm_store import LocalWormStore
from tests.integration import lora_vllm_server
from tests.integration.training_fixtures import MODEL, tiny_base_model  # noqa: F401 - fixture
from tests.unit.collectors.flaky_clickhouse import FlakyClickHouseClient

pytestmark = [pytest.mark.vllm, pytest.mark.training]

USERS = [f"user-{i}" for i in range(24)]


@pytest.fixture(scope="module")
def lora_vllm(tiny_base_model, tmp_path_factory):  # noqa: F811
    """``vllm`` OpenAI server for the tiny model with runtime LoRA updating enabled."""
    work = tmp_path_factory.mktemp("vllm-routing")
    log = work / "server.log"
    proc, client = lora_vllm_server.start(tiny_base_model, MODEL, log, cwd=work)
    try:
        lora_vllm_server.wait_until_serving(proc, client, MODEL, log, timeout_s=600)
        yield client
    finally:
        lora_vllm_server.stop(proc)


def _random_adapter(base: Path, folder: Path) -> Path:
    """A PEFT LoRA adapter (r=8, q_proj/v_proj) with random, non-zero weights: no training needed to
    be served, and it changes the answers, so the adapter visibly did the serving."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM.from_pretrained(str(base), dtype=torch.float32)
    lora = get_peft_model(model, LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"],
                                            init_lora_weights=False))
    lora.save_pretrained(str(folder))
    return folder


def _wait(condition, what: str, limit_s: float = 60.0) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def _served_models(client: TestClient) -> list[str]:
    models = []
    for user in USERS:
        answer = client.post("/v1/completions", json={
            "model": MODEL, "prompt": "alpha route", "max_tokens": 2, "temperature": 0.0, "user": user,
        })
        assert answer.status_code == 200, answer.text
        models.append(answer.json()["model"])  # vLLM names the model (or adapter) that served
    return models


def test_gateway_routes_canary_users_to_the_loaded_adapter_and_follows_rollback(
        lora_vllm, tiny_base_model, tmp_path, chdb_client) -> None:  # noqa: F811
    from entroloop.cli.training import rollback_adapter

    database = f"t_route_{random.randrange(16**8):08x}"
    actions = ActionLog()
    registry = AdapterRegistry(LocalWormStore(tmp_path / "adapters"), chdb_client, database, actions)
    registry.ensure_schema()
    adapter_id = registry.register(_random_adapter(tiny_base_model, tmp_path / "lora"), model=MODEL,
                                   base_model_digest="b", dataset_digest="d", metrics={}).adapter_id
    lora_vllm.load(adapter_id, str(registry.fetch(adapter_id, tmp_path / "served" / adapter_id)))
    registry.set_status(adapter_id, "canary", share=0.5)
    expected = [AdapterRouting(MODEL, canary=adapter_id, share=0.5).choose(u) for u in USERS]
    assert set(expected) == {adapter_id, MODEL}  # 24 users: both sides are exercised

    table = RoutingTable(lambda: chdb_client, database, refresh_s=0.2)
    stale = FlakyClickHouseClient(chdb_client)
    stale_table = RoutingTable(lambda: stale, database, refresh_s=3600)
    assert stale_table.refresh()  # holds the canary state; ClickHouse "goes away" for it below
    published: list = []
    config = GatewayConfig(upstream=lora_vllm.base_url, engine="vllm", node_id="gw", route="support")
    with TestClient(create_app(config, published.append, PiiRedactor(b"k"), routing=table)) as client:
        _wait(lambda: table.refreshes >= 1, "the first routing read")
        assert _served_models(client) == expected
        audits = [r for r in published if isinstance(r, Audit)]
        assert [(a.model, a.adapter) for a in audits] == [(MODEL, m if m == adapter_id else "") for m in expected]

        settings = Settings(data_dir=tmp_path, vllm_servers=[lora_vllm.base_url], base_model_name=MODEL,
                            adapter_store_dir=tmp_path / "adapters")
        assert rollback_adapter(settings, registry, actions, adapter_id, "bad canary") == MODEL
        assert adapter_id not in lora_vllm.models()
        written = table.refreshes
        _wait(lambda: table.refreshes >= written + 2, "a refresh that began after the rollback")
        assert _served_models(client) == [MODEL] * len(USERS)

    # a gateway that missed the rollback (ClickHouse unreachable) still serves every request:
    # vLLM answers 404 for the unloaded adapter and the gateway asks again for the base model
    stale.down = True
    published.clear()
    with TestClient(create_app(config, published.append, PiiRedactor(b"k"), routing=stale_table)) as client:
        assert _served_models(client) == [MODEL] * len(USERS)
    assert stale_table.routings[MODEL].canary == adapter_id and stale_table.failures >= 1
    assert {(a.model, a.adapter) for a in published if isinstance(a, Audit)} == {(MODEL, "")}
