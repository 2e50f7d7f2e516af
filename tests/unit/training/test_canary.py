"""Canary state machine, router and publisher (fake servers and clock), ClickHouse metrics on chDB."""

from __future__ import annotations

import time

import pytest
from entroloop.training.actions import ActionLog
from entroloop.training.publisher import (
    AdapterPublisher,
    CanaryController,
    CanaryHealth,
    CanaryPolicy,
    CanaryRouter,
    ClickHouseCanaryMetrics,
    VllmError,
)

from entroloop.contract.ids import NodeStamper, new_span_id
from entroloop.contract.records import Alert, Fallback, Span

POLICY = CanaryPolicy(shares=(0.03, 0.3, 1.0), stage_seconds=9.0, checks_per_stage=3, min_requests=20,
                      error_rate_limit=0.03)
HEALTHY = CanaryHealth(requests=100, errors=3)  # exactly at the limit is still healthy


def test_three_stages_of_three_checks_promote() -> None:
    c = CanaryController(POLICY)
    assert c.start(0.0).share == 0.03
    kinds = [c.observe(HEALTHY, float(t)).kind for t in range(3, 28, 3)]
    assert kinds == ["healthy", "healthy", "widen", "healthy", "healthy", "widen", "healthy", "healthy", "promote"]
    assert c.state == "promoted"


def test_error_rate_over_limit_rolls_back_at_once() -> None:
    c = CanaryController(POLICY)
    c.start(0.0)
    c.observe(HEALTHY, 3.0)
    d = c.observe(CanaryHealth(requests=100, errors=4), 6.0)
    assert d.kind == "rollback" and "error rate 0.0400 > limit 0.03" in d.reason and c.state == "rolled_back"


@pytest.mark.parametrize("health,word", [(CanaryHealth(100, fallbacks=11), "fallback"),
                                         (CanaryHealth(100, anomalies=6), "entropy anomaly")])
def test_fallback_and_anomaly_limits(health, word) -> None:
    c = CanaryController(POLICY)
    c.start(0.0)
    d = c.observe(health, 3.0)
    assert d.kind == "rollback" and word in d.reason


def test_too_little_traffic_waits_and_does_not_count() -> None:
    c = CanaryController(POLICY)
    c.start(0.0)
    assert c.observe(CanaryHealth(requests=19, errors=19), 3.0).kind == "wait"
    assert c.healthy_checks == 0
    # Checks done, but the stage has not lasted stage_seconds yet: no widening.
    c2 = CanaryController(CanaryPolicy(stage_seconds=100.0, checks_per_stage=1))
    c2.start(0.0)
    assert c2.observe(HEALTHY, 50.0).kind == "healthy"
    assert c2.observe(HEALTHY, 100.0).kind == "widen"


def test_router_share_is_sticky_and_close_to_target() -> None:
    router = CanaryRouter("base")
    router.set_canary("adapter-1", 0.3)
    ids = [f"req-{i}" for i in range(20000)]
    first = [router.choose(r) for r in ids]
    assert first == [router.choose(r) for r in ids]
    share = first.count("adapter-1") / len(ids)
    assert 0.28 < share < 0.32
    router.set_canary("adapter-1", 1.0)
    assert {router.choose(r) for r in ids[:100]} == {"adapter-1"}
    router.clear_canary()
    assert {router.choose(r) for r in ids[:100]} == {"base"}


class FakeServer:
    def __init__(self, url: str, fail_load: bool = False) -> None:
        self.base_url, self.fail_load, self.loaded = url, fail_load, set()

    def load(self, name: str, path: str) -> str:
        if self.fail_load:
            raise VllmError(f"{self.base_url}: HTTP 500")
        self.loaded.add(name)
        return "ok"

    def unload(self, name: str) -> str:
        self.loaded.discard(name)
        return "ok"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _publisher(servers, health_at):
    clock = FakeClock()
    actions = ActionLog()
    router = CanaryRouter("base")
    pub = AdapterPublisher(servers, router, lambda adapter, since: health_at(clock.now), POLICY, actions,
                           clock=clock, sleep=clock.sleep)
    return pub, router, actions


def test_healthy_rollout_promotes_on_every_server() -> None:
    servers = [FakeServer("http://a"), FakeServer("http://b")]
    pub, router, actions = _publisher(servers, lambda now: HEALTHY)
    result = pub.rollout("ad-1", "/adapters/ad-1")
    assert result.outcome == "promoted"
    assert router.choose("any") == "ad-1"
    assert all("ad-1" in s.loaded for s in servers)
    names = actions.names("ad-1")
    assert names[:3] == ["adapter.loaded", "adapter.loaded", "canary.stage"]
    assert names.count("canary.stage") == 3 and names.count("canary.check") == 9
    assert names[-1] == "canary.promoted"


def test_error_spike_in_second_stage_rolls_back_and_unloads() -> None:
    servers = [FakeServer("http://a"), FakeServer("http://b")]
    pub, router, actions = _publisher(servers, lambda now: HEALTHY if now < 1012 else CanaryHealth(50, errors=5))
    result = pub.rollout("ad-2", "/adapters/ad-2")
    assert result.outcome == "rolled_back" and result.stage == 1 and result.share == 0.3
    assert router.choose("any") == "base" and router.canary == ""
    assert not any(s.loaded for s in servers)
    names = actions.names("ad-2")
    assert names[-3:] == ["canary.rolled_back", "adapter.unloaded", "adapter.unloaded"]
    rolled = [r for r in actions.records if r.action == "canary.rolled_back"][0]
    assert "error rate 0.1000" in rolled.detail


def test_failed_load_unloads_the_servers_already_loaded() -> None:
    servers = [FakeServer("http://a"), FakeServer("http://b", fail_load=True)]
    pub, router, actions = _publisher(servers, lambda now: HEALTHY)
    result = pub.rollout("ad-3", "/x")
    assert result.outcome == "load_failed" and not servers[0].loaded
    assert actions.names("ad-3") == ["adapter.loaded", "adapter.load_failed", "adapter.unloaded"]
    assert router.choose("any") == "base"


def test_clickhouse_canary_metrics(chdb_client, ch_database) -> None:
    from entroloop.sinks.clickhouse.writer import ClickHouseSink

    sink = ClickHouseSink(chdb_client, ch_database)
    stamper = NodeStamper("gw")
    since = time.time() - 1
    spans = [
        Span(**stamper.stamp(), request_id=f"r{i}", span_id=new_span_id(), name="llm_request",
             start_time=since, end_time=since + 0.1, model=model, status="error" if i % 10 == 0 else "ok")
        for i in range(40) for model in ("ad-x", "base")
    ]
    sink.write(Span.topic, 0, 0, len(spans) - 1, spans)
    fallbacks = [Fallback(**stamper.stamp(), request_id=f"r{i}", model="ad-x", reason="low_intent") for i in range(3)]
    sink.write(Fallback.topic, 0, 0, 2, fallbacks)
    alerts = [Alert(**stamper.stamp(), request_id="r1", alert_key=f"k{i}", rule=rule, model="ad-x")
              for i, rule in enumerate(["repetition_loop", "gibberish", "slo_breach"])]
    # The entropy tap names the engine's model, not the adapter: attributed through request_id.
    alerts.append(Alert(**stamper.stamp(), request_id="r2", alert_key="k9", rule="gibberish", model="tiny-llama"))
    alerts.append(Alert(**stamper.stamp(), request_id="not-canary", alert_key="k10", rule="gibberish", model="tiny"))
    sink.write(Alert.topic, 0, 0, len(alerts) - 1, alerts)
    health = ClickHouseCanaryMetrics(chdb_client, ch_database)("ad-x", since - 5)
    assert health == CanaryHealth(requests=40, errors=4, fallbacks=3, anomalies=2)
    assert ClickHouseCanaryMetrics(chdb_client, ch_database)("ad-x", time.time() + 60).requests == 0


def test_canary_without_traffic_is_abandoned() -> None:
    c = CanaryController(CanaryPolicy(min_requests=20, max_idle_checks=3))
    c.start(0.0)
    kinds = [c.observe(CanaryHealth(requests=5), float(t)).kind for t in (1, 2, 3)]
    assert kinds == ["wait", "wait", "rollback"] and c.state == "rolled_back"


def test_promotion_supersedes_the_previous_adapter(tmp_path, chdb_client, ch_database) -> None:
    from entroloop.training.registry import AdapterRegistry

    from entroloop.infra.worm.worm_store import LocalWormStore

    actions = ActionLog()
    registry = AdapterRegistry(LocalWormStore(tmp_path), chdb_client, ch_database, actions)
    registry.ensure_schema()
    ids = []
    for n in range(2):
        folder = tmp_path / f"a{n}"
        folder.mkdir()
        (folder / "adapter_model.safetensors").write_bytes(bytes([n]))
        ids.append(registry.register(folder, model="m", base_model_digest="b", dataset_digest="d",
                                     metrics={}).adapter_id)
    clock = FakeClock()
    router = CanaryRouter("base")
    pub = AdapterPublisher([FakeServer("http://a")], router, lambda a, s: HEALTHY, POLICY, actions, registry,
                           clock=clock, sleep=clock.sleep)
    assert pub.rollout(ids[0], "/p0").outcome == "promoted"
    assert pub.rollout(ids[1], "/p1").outcome == "promoted"
    assert registry.status(ids[0]) == "superseded" and registry.promoted("m") == ids[1]
    pub.rollback(ids[1], "bad in production")
    assert router.choose("x") == "base" and registry.promoted("m") == ""
