"""FallbackRateMonitor: window boundaries, hopping sums, SLO, circuit breaker, lateness."""

from __future__ import annotations

from entroloop.streams.fallback_rates import FallbackRateMonitor
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from entroloop.contract.records import Alert, Health
from entroloop.contract.settings import Settings

from .analytics_records import audit, fallback

T0 = 6000.0  # a minute boundary (6000 = 100 * 60)


def _windows(records: list, metric: str, tier: str = "primary") -> dict[str, tuple[int, int, float]]:
    return {
        r.labels["window_start"]: (int(r.labels["fallbacks"]), int(r.labels["requests"]), r.value)
        for r in records
        if isinstance(r, Health) and r.metric == metric and r.labels["tier"] == tier
    }


def _alerts(records: list, rule: str) -> list[Alert]:
    return [r for r in records if isinstance(r, Alert) and r.rule == rule]


def test_tumbling_minute_boundaries() -> None:
    mon = FallbackRateMonitor(grace_s=0)
    for i in range(10):
        mon.process(audit(f"a{i}", at=T0 + i))          # minute T0
    mon.process(fallback("a0", at=T0))                   # first instant of minute T0
    mon.process(fallback("a1", at=T0 + 59.999))          # last instant of minute T0
    mon.process(fallback("b0", at=T0 + 60.0))            # first instant of the next minute
    mon.process(audit("b0", at=T0 + 60.0))
    assert _windows(mon.on_watermark(T0 + 59.999), "fallback_rate_1m") == {}
    closed = mon.on_watermark(T0 + 60.0)
    assert _windows(closed, "fallback_rate_1m") == {f"{T0:.0f}": (2, 10, 0.2)}
    nxt = mon.on_watermark(T0 + 120.0)
    assert _windows(nxt, "fallback_rate_1m") == {f"{T0 + 60:.0f}": (1, 1, 1.0)}


def test_hopping_five_minute_windows_sum_five_buckets_and_slide_past_data() -> None:
    mon = FallbackRateMonitor(grace_s=0)
    mon.process(audit("a", at=T0 + 10))
    mon.process(fallback("a", at=T0 + 10))
    out = mon.on_watermark(T0 + 10 * 60)
    five = _windows(out, "fallback_rate_5m")
    # The event at minute T0 lies in the 5 windows starting T0-240 .. T0 (hop 60 s).
    assert sorted(five) == [f"{T0 + k * 60:.0f}" for k in range(-4, 1)]
    assert all(v == (1, 1, 1.0) for v in five.values())
    assert all(r.labels["window_end"] == f"{float(r.labels['window_start']) + 300:.0f}"
               for r in out if isinstance(r, Health) and r.metric == "fallback_rate_5m")


def test_all_tiers_aggregate_and_rate_per_tier() -> None:
    mon = FallbackRateMonitor(grace_s=0)
    for i in range(20):
        mon.process(audit(f"a{i}", at=T0))
    for i in range(3):
        mon.process(fallback(f"a{i}", tier="primary", at=T0))
    mon.process(fallback("a9", tier="secondary", at=T0))
    out = mon.on_watermark(T0 + 60)
    assert _windows(out, "fallback_rate_1m", "primary")[f"{T0:.0f}"] == (3, 20, 0.15)
    assert _windows(out, "fallback_rate_1m", "secondary")[f"{T0:.0f}"] == (1, 20, 0.05)
    assert _windows(out, "fallback_rate_1m", "*")[f"{T0:.0f}"] == (4, 20, 0.2)


def test_slo_alert_needs_rate_above_limit_and_enough_requests() -> None:
    mon = FallbackRateMonitor(slo_rate=0.05, slo_min_requests=100, grace_s=0)
    for i in range(100):
        mon.process(audit(f"a{i}", at=T0 + i * 0.5))
    for i in range(5):  # exactly 5 %: not above the limit
        mon.process(fallback(f"a{i}", at=T0 + 1))
    assert _alerts(mon.on_watermark(T0 + 60), "fallback_rate_slo") == []
    mon2 = FallbackRateMonitor(slo_rate=0.05, slo_min_requests=100, grace_s=0)
    for i in range(100):
        mon2.process(audit(f"a{i}", at=T0 + i * 0.5))
    for i in range(6):
        mon2.process(fallback(f"a{i}", at=T0 + 1))
    slo = _alerts(mon2.on_watermark(T0 + 60), "fallback_rate_slo")
    assert {a.alert_key.rsplit(":", 2)[1] for a in slo} == {"primary", "*"}
    assert abs(slo[0].value - 0.06) < 1e-9 and slo[0].threshold == 0.05
    few = FallbackRateMonitor(slo_rate=0.05, slo_min_requests=100, grace_s=0)
    for i in range(10):
        few.process(audit(f"a{i}", at=T0))
        few.process(fallback(f"a{i}", at=T0))  # 100 % of 10 requests: too few to judge
    assert _alerts(few.on_watermark(T0 + 60), "fallback_rate_slo") == []


def test_circuit_breaker_fires_on_the_event_that_crosses_the_limit_once() -> None:
    mon = FallbackRateMonitor(circuit_limit=10)
    fired = []
    for i in range(10):  # spread over minutes T0..T0+4: all inside one 5-minute window
        fired += mon.process(fallback(f"f{i}", at=T0 + (i % 5) * 60))
    assert fired == []  # 10 is the limit, not above it
    crossing = mon.process(fallback("f10", at=T0 + 4 * 60 + 30))
    assert {a.alert_key.split(":")[3] for a in crossing} == {"primary", "*"}
    assert all(a.severity == "critical" and a.value == 11 for a in crossing)
    assert mon.process(fallback("f11", at=T0 + 4 * 60 + 31)) == []  # already open


def test_circuit_breaker_counts_only_the_last_five_minutes_and_rearms() -> None:
    mon = FallbackRateMonitor(circuit_limit=3, grace_s=0)
    for i in range(3):
        mon.process(fallback(f"old{i}", at=T0))
    # Five minutes later the T0 minute is outside the window ending at T0+6min.
    assert mon.process(fallback("new", at=T0 + 5 * 60)) == []
    assert len(mon.process(fallback("new2", at=T0 + 5 * 60 + 1))) == 0
    for i in range(2):
        mon.process(fallback(f"burst{i}", at=T0 + 5 * 60 + 2))
    assert mon.open_breakers  # 4 in the window: open
    mon.on_watermark(T0 + 20 * 60)  # quiet windows close: re-armed
    assert not mon.open_breakers
    for i in range(4):
        fired = mon.process(fallback(f"again{i}", at=T0 + 21 * 60))
    assert len(fired) == 2


def test_late_events_are_counted_not_applied() -> None:
    mon = FallbackRateMonitor(grace_s=5)
    mon.process(fallback("a", at=T0))
    mon.on_watermark(T0 + 64)  # minute T0 still in grace
    assert mon.process(fallback("b", at=T0 + 30)) == [] and mon.late_events == 0
    out = mon.on_watermark(T0 + 65)
    assert _windows(out, "fallback_rate_1m")[f"{T0:.0f}"][0] == 2
    mon.process(fallback("c", at=T0 + 59))
    assert mon.late_events == 1


def test_sources_filter() -> None:
    mon = FallbackRateMonitor(grace_s=0, sources=["gateway"])
    mon.process(fallback("a", at=T0, source="intent"))
    mon.process(fallback("b", at=T0, source="gateway"))
    assert _windows(mon.on_watermark(T0 + 60), "fallback_rate_1m")[f"{T0:.0f}"][0] == 1


def test_by_default_intent_fallbacks_do_not_count_towards_the_serving_fallback_rate() -> None:
    # intent fallbacks are derived from audits later in the stream: counting them made a replay of
    # the 2,000-request demo add fallback_rate_slo alerts the live run had dropped as late
    mon = FallbackRateMonitor.from_settings(Settings())
    mon.process(fallback("a", at=T0, source="intent"))
    mon.process(fallback("b", at=T0))  # the record's default source: gateway
    assert _windows(mon.on_watermark(T0 + 120), "fallback_rate_1m")[f"{T0:.0f}"][0] == 1
    everything = FallbackRateMonitor.from_settings(Settings(fallback_rate_sources=[]))
    everything.process(fallback("a", at=T0, source="intent"))
    assert _windows(everything.on_watermark(T0 + 120), "fallback_rate_1m")[f"{T0:.0f}"][0] == 1


def test_state_is_pruned_after_windows_close() -> None:
    mon = FallbackRateMonitor(grace_s=0)
    mon.process(fallback("a", at=T0))
    mon.process(audit("a", at=T0))
    mon.on_watermark(T0 + 3600)
    assert mon.fallbacks == {} and mon.requests == {}



@hsettings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(min_value=0, max_value=900), st.booleans()), min_size=1, max_size=120),
       st.integers(min_value=1, max_value=7))
def test_property_windows_account_for_every_event(events: list[tuple[float, bool]], step: int) -> None:
    """Whatever the order of watermarks: 1m windows sum to the input, 5m windows sum their minutes."""
    mon = FallbackRateMonitor(grace_s=0, circuit_limit=10**9)
    out = []
    ordered = sorted(events)
    for i, (offset, is_fallback) in enumerate(ordered):
        mon.process(fallback(f"f{i}", at=T0 + offset) if is_fallback else audit(f"a{i}", at=T0 + offset))
        if i % step == 0:
            out += mon.on_watermark(T0 + offset)  # never past an event still to come
    out += mon.on_watermark(T0 + 10_000)
    one = _windows(out, "fallback_rate_1m", "*")
    assert sum(f for f, _, _ in one.values()) == sum(1 for _, fb in events if fb)
    assert mon.late_events == 0
    five = _windows(out, "fallback_rate_5m", "*")
    for start, (fb5, _, _) in five.items():
        minutes = [f"{float(start) + k * 60:.0f}" for k in range(5)]
        assert fb5 == sum(one.get(m, (0, 0, 0))[0] for m in minutes)
