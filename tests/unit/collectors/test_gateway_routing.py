"""Adapter routing on live traffic: the gateway routes a base model's requests to its canary or
promoted LoRA adapter as the registry's adapter_status (chDB) says, names the adapter in the Audit
record and the Span, follows a rollback within one refresh, and never fails a request because of
routing (ClickHouse unreachable: last known state; adapter not loaded upstream: base model)."""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from entroloop.collectors.gateway.app import GatewayConfig, create_app
from entroloop.collectors.gateway.routing import RoutingTable
from entroloop.training.actions import ActionLog
from entroloop.training.registry import AdapterRegistry
from starlette.testclient import TestClient

from entroloop.contract.records import Audit, Span
from entroloop.contract.settings import Settings
from entroloop.infra.adapter_routing import AdapterRouting
from entroloop.infra.pii import PiiRedactor
from entroloop.infra.worm.worm_store import LocalWormStore
from tests.unit.collectors.fake_openai_upstream import FakeUpstream
from tests.unit.collectors.flaky_clickhouse import FlakyClickHouseClient

BASE = "base-m"  # the fake engine's base model; adapters are registered for it
USERS = [f"user-{i}" for i in range(300)]


def _wait(condition: Callable[[], bool], what: str, limit_s: float = 30.0) -> None:
    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _register(registry: AdapterRegistry, folder: Path, n: int) -> str:
    folder.mkdir()
    (folder / "adapter_config.json").write_text("{}")
    (folder / "adapter_model.safetensors").write_bytes(bytes([n]))
    return registry.register(folder, model=BASE, base_model_digest="b", dataset_digest=f"d{n}", metrics={}).adapter_id


def _chat(client: TestClient, user: str, model: str = BASE) -> Any:
    answer = client.post("/v1/chat/completions", json={
        "model": model, "messages": [{"role": "user", "content": "hi"}], "user": user, "max_tokens": 4,
    })
    assert answer.status_code == 200, answer.text
    return answer


def _routed_models(upstream: FakeUpstream, start: int) -> list[str]:
    return [body["model"] for _path, body, _headers in upstream.received[start:]]


def _records(published: list, kind: type) -> list:
    return [r for r in published if isinstance(r, kind)]


def test_gateway_routes_canary_share_and_follows_rollback(tmp_path, chdb_client, ch_database) -> None:
    from entroloop.cli.training import rollback_adapter

    actions = ActionLog()
    registry = AdapterRegistry(LocalWormStore(tmp_path / "adapters"), chdb_client, ch_database, actions)
    registry.ensure_schema()
    canary = _register(registry, tmp_path / "c", 1)
    registry.set_status(canary, "canary", share=0.5)
    table = RoutingTable(lambda: chdb_client, ch_database, refresh_s=0.05)
    published: list = []
    config = GatewayConfig(upstream="", engine="vllm", node_id="gw-r", route="support")

    with FakeUpstream(vllm=True) as upstream:
        config.upstream = upstream.url
        with TestClient(create_app(config, published.append, PiiRedactor(b"k"), routing=table)) as client:
            _wait(lambda: table.refreshes >= 1, "the first routing read")
            assert table.routings[BASE] == AdapterRouting(BASE, canary=canary, share=0.5)

            for user in USERS:
                _chat(client, user)
            served = _routed_models(upstream, 0)
            # a canary at share 0.5 gets about half the users (binomial, 4 standard deviations)
            on_canary = served.count(canary) / len(USERS)
            assert abs(on_canary - 0.5) <= 4 * math.sqrt(0.25 / len(USERS))
            assert set(served) == {canary, BASE}
            # sticky: the same users get the same model again
            for user in USERS[:50]:
                _chat(client, user)
            assert _routed_models(upstream, len(USERS)) == served[:50]
            # the client naming an adapter itself is not re-routed
            _chat(client, "user-x", model="support-lora")
            assert _routed_models(upstream, len(USERS) + 50) == ["support-lora"]

            # `entroloop adapters rollback` writes the new state; within one refresh all goes to base
            settings = Settings(data_dir=tmp_path, vllm_servers=[], base_model_name=BASE,
                                adapter_store_dir=tmp_path / "adapters")
            assert rollback_adapter(settings, registry, actions, canary, "bad canary") == BASE
            written = table.refreshes
            _wait(lambda: table.refreshes >= written + 2, "a refresh that began after the rollback")
            start = len(upstream.received)
            for user in USERS[:100]:
                _chat(client, user)
            assert set(_routed_models(upstream, start)) == {BASE}

    # the Audit record and the Span name the adapter actually used, under the base model
    audits = {a.user_id: a for a in _records(published, Audit)[: len(USERS)]}
    redactor = PiiRedactor(b"k")
    for user, model in zip(USERS, served, strict=True):
        audit = audits[redactor.pseudonymise_user(user)]
        assert audit.model == BASE and audit.adapter == (model if model == canary else "")
    spans = _records(published, Span)
    first = spans[: len(USERS)]
    assert sum(s.attributes["entroloop.adapter"] == canary for s in first) == served.count(canary)
    assert {s.attributes["entroloop.routed"] for s in first} == {"canary", "stable"}
    assert all(s.model == BASE for s in first)
    direct = spans[len(USERS) + 50]
    assert direct.attributes["entroloop.adapter"] == "support-lora" and direct.attributes["entroloop.routed"] == ""
    after = _records(published, Audit)[-100:]
    assert {(a.model, a.adapter) for a in after} == {(BASE, "")}


def test_unreachable_clickhouse_keeps_last_state_and_logs_once(tmp_path, chdb_client, ch_database, caplog) -> None:
    registry = AdapterRegistry(LocalWormStore(tmp_path / "adapters"), chdb_client, ch_database, ActionLog())
    registry.ensure_schema()
    promoted = _register(registry, tmp_path / "p", 2)
    registry.set_status(promoted, "promoted", share=1.0)
    flaky = FlakyClickHouseClient(chdb_client)
    connects: list[int] = []

    def connect() -> Any:
        connects.append(1)
        if len(connects) == 2:
            raise OSError("no route to host")  # reconnecting fails once too
        return flaky

    table = RoutingTable(connect, ch_database, refresh_s=60)
    assert table.refresh() and table.routings[BASE].stable == promoted
    flaky.down = True
    with caplog.at_level(logging.WARNING, logger="entroloop.collectors.gateway.routing"):
        assert [table.refresh() for _ in range(4)] == [False] * 4
        assert table.routings[BASE] == AdapterRouting(BASE, stable=promoted)  # last known state
        assert len([r for r in caplog.records if "not refreshed" in r.message]) == 1
        flaky.down = False
        assert table.refresh() and table.failures == 4
        assert len([r for r in caplog.records if "refreshed again" in r.message]) == 1

    # requests are served while ClickHouse is down; an adapter the engine has not loaded -> base model
    published: list = []
    with FakeUpstream(vllm=True) as upstream:
        upstream.missing.add(promoted)
        flaky.down = True
        config = GatewayConfig(upstream=upstream.url, engine="vllm")
        with TestClient(create_app(config, published.append, PiiRedactor(b"k"), routing=table)) as client:
            answer = _chat(client, "user-1")
            streamed = client.post("/v1/chat/completions", json={
                "model": BASE, "messages": [{"role": "user", "content": "hi"}], "user": "user-2", "stream": True,
            })
        assert [body["model"] for _p, body, _h in upstream.received] == [promoted, BASE, promoted, BASE]
    assert answer.json()["model"] == BASE
    assert streamed.status_code == 200 and "Hello there, hi" in "".join(
        json.loads(line[5:])["choices"][0]["delta"]["content"]
        for line in streamed.text.splitlines() if line.startswith("data: {"))
    assert [(a.model, a.adapter) for a in _records(published, Audit)] == [(BASE, ""), (BASE, "")]
