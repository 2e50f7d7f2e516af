"""EntropyBaselineDetector: a model is judged against its own band, not a global threshold."""

from __future__ import annotations

import json

import msgspec
import numpy as np
from entroloop.streams.entropy_baseline import (
    BaselineState,
    EntropyBaselineDetector,
    HistogramQuantileSketch,
)
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from entroloop.contract.records import Alert

from .analytics_records import tokens


def _train(det: EntropyBaselineDetector, model: str, center: float, n: int = 300, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    for i in range(n):
        mean = center + rng.uniform(-0.3, 0.3)
        assert det.process(tokens(f"{model}-train-{i}", [mean] * 8, model=model)) == []


def test_no_alert_before_min_samples() -> None:
    det = EntropyBaselineDetector(min_samples=50)
    for i in range(49):
        det.process(tokens(f"r{i}", [2.0] * 4))
    assert det.band("m") is None
    assert det.process(tokens("outlier", [9.0] * 4)) == []  # 50th request: still learning


def test_each_model_judged_against_its_own_band() -> None:
    det = EntropyBaselineDetector(min_samples=100, margin_nats=0.1)
    _train(det, "cold", 1.0)
    _train(det, "hot", 4.0, seed=1)
    # 3.0 nats is normal for nobody: above cold's band, below hot's band.
    cold = det.process(tokens("x1", [3.0] * 10, model="cold"))
    hot = det.process(tokens("x2", [3.0] * 10, model="hot"))
    assert len(cold) == 1 and len(hot) == 1
    assert cold[0].threshold > 1.0 and cold[0].detail.find("above") > 0
    assert hot[0].threshold < 4.0 and "below" in hot[0].detail
    # 4.0 nats is normal for "hot" only.
    assert det.process(tokens("x3", [4.0] * 10, model="hot")) == []
    assert len(det.process(tokens("x4", [4.0] * 10, model="cold"))) == 1


def test_alert_fields_carry_span_rule_and_baseline() -> None:
    det = EntropyBaselineDetector(min_samples=100)
    _train(det, "m", 2.0)
    (alert,) = det.process(tokens("bad", [6.0] * 7, model="m", first_token_index=0))
    assert isinstance(alert, Alert)
    assert alert.rule == "entropy_baseline_shift"
    assert (alert.token_start, alert.token_end) == (0, 7)
    assert abs(alert.value - 6.0) < 0.01
    baseline = json.loads(alert.baseline)
    assert 1.6 < baseline["q_low"] < baseline["p50"] < baseline["q_high"] < 2.4
    assert baseline["n"] == 300
    assert alert.threshold == baseline["q_high"] or abs(alert.threshold - baseline["q_high"]) < 1e-3
    assert alert.alert_key == "entropy_baseline_shift:bad"
    # Deterministic output: the same input gives the same event id.
    det2 = EntropyBaselineDetector(min_samples=100)
    _train(det2, "m", 2.0)
    assert det2.process(tokens("bad", [6.0] * 7, model="m"))[0].event_id != ""


def test_margin_boundary() -> None:
    det = EntropyBaselineDetector(min_samples=10, margin_nats=0.5, quantile_low=0.01, quantile_high=0.99)
    for i in range(200):
        det.process(tokens(f"r{i}", [2.0]))  # every request exactly 2.0 -> band is one bin wide
    low, _, high = det.band("m")
    inside = high + 0.5 - 0.05
    outside = high + 0.5 + 0.05
    assert det.process(tokens("in", [inside])) == []
    assert len(det.process(tokens("out", [outside]))) == 1


def test_routes_are_separate_baselines() -> None:
    det = EntropyBaselineDetector(min_samples=100)
    rng = np.random.default_rng(3)
    for i in range(200):
        det.process(tokens(f"a{i}", [1.0 + rng.uniform(-0.2, 0.2)], route="json"))
        det.process(tokens(f"b{i}", [3.0 + rng.uniform(-0.2, 0.2)], route="chat"))
    assert det.process(tokens("c", [3.0], route="chat")) == []
    assert len(det.process(tokens("d", [3.0], route="json"))) == 1


def test_chunks_of_one_request_are_judged_once_on_final() -> None:
    det = EntropyBaselineDetector(min_samples=100)
    _train(det, "m", 2.0)
    assert det.process(tokens("long", [6.0] * 4, final=False, chunk_index=0)) == []
    out = det.process(tokens("long", [6.0] * 4, final=True, chunk_index=1, first_token_index=4))
    assert len(out) == 1 and (out[0].token_start, out[0].token_end) == (0, 8)
    assert det.state.partial == {}


def test_stale_partial_chunks_expire_on_watermark() -> None:
    det = EntropyBaselineDetector(partial_ttl_s=60)
    det.process(tokens("orphan", [1.0], final=False, at=1000.0))
    det.on_watermark(1050.0)
    assert "orphan" in det.state.partial
    det.on_watermark(1061.0)
    assert det.state.partial == {}


def test_state_round_trips_through_msgspec() -> None:
    det = EntropyBaselineDetector(min_samples=100)
    _train(det, "m", 2.0)
    blob = msgspec.msgpack.encode(det.state)
    restored = EntropyBaselineDetector(min_samples=100, state=msgspec.msgpack.decode(blob, type=BaselineState))
    assert restored.state == det.state
    key = "m\x1fdefault"
    assert restored.band("m") == tuple(det.state.sketches[key].quantiles([0.01, 0.5, 0.99]))


def test_forgetting_follows_a_lasting_shift() -> None:
    det = EntropyBaselineDetector(min_samples=100, half_life_requests=200)
    _train(det, "m", 1.0, n=400)
    alerts = 0
    for i in range(3000):
        alerts += len(det.process(tokens(f"s{i}", [3.0], model="m")))
    assert alerts > 0
    assert det.process(tokens("late", [3.0], model="m")) == []  # the new level is now normal


@hsettings(max_examples=50, deadline=None)
@given(st.lists(st.floats(min_value=0.0, max_value=15.0), min_size=50, max_size=400),
       st.floats(min_value=0.05, max_value=0.95))
def test_sketch_quantile_within_one_bin_of_exact(values: list[float], q: float) -> None:
    sketch = HistogramQuantileSketch(bin_width=0.02)
    for v in values:
        sketch.add(v)
    (estimate,) = sketch.quantiles([q])
    ordered = sorted(values)
    # The true q-quantile lies between the order statistics around rank q*n.
    lo = ordered[max(int(np.floor(q * len(values))) - 1, 0)]
    hi = ordered[min(int(np.ceil(q * len(values))), len(values) - 1)]
    assert lo - 0.021 <= estimate <= hi + 0.021


def test_sketch_merge_adds_counts() -> None:
    a, b = HistogramQuantileSketch(), HistogramQuantileSketch()
    for v in (1.0, 1.0, 1.0):
        a.add(v)
    for v in (5.0, 5.0, 5.0):
        b.add(v)
    a.merge(b)
    assert a.total == 6 and a.quantiles([0.25])[0] < 1.1 and a.quantiles([0.9])[0] > 4.9
