"""EntropyAnomalyDetector with evidence: loops need repetition, gibberish a level above the band.

Each test pairs the case with its mirror (the static rule alone, or the other model, or the
non-repeating twin), so it fails if the evidence stops mattering."""

from __future__ import annotations

import json

import numpy as np
from entroloop.streams.entropy_anomaly import GIBBERISH, LOOP, EntropyAnomalyDetector
from entroloop.streams.entropy_bands import EntropyBands
from entroloop.streams.entropy_evidence import EntropyEvidence
from entroloop.streams.periodicity import find_entropy_period, find_id_period

from entroloop.contract.records import Alert, pack_token_hashes
from entroloop.contract.settings import Settings

from .analytics_records import tokens


def _detector(min_requests: int = 20) -> EntropyAnomalyDetector:
    return EntropyAnomalyDetector(evidence=EntropyEvidence(bands=EntropyBands(min_requests=min_requests)))


def _code_like(rng: np.random.Generator, n: int) -> list[float]:
    """A low-temperature code model's normal text: mostly below 1.5 nats, never repeating."""
    return [float(x) for x in np.clip(rng.gamma(1.4, 1.5 / 1.4, size=n), 0.01, 6.0)]


def _loop(period: int, n: int, rng: np.random.Generator) -> tuple[list[float], list[int]]:
    cycle = rng.uniform(0.05, 0.9, size=period)
    ids = rng.integers(0, 30_000, size=period)
    return ([float(cycle[i % period] * rng.uniform(0.97, 1.03)) for i in range(n)],
            [int(ids[i % period]) for i in range(n)])


def _evidence(alert: Alert) -> dict[str, object]:
    return json.loads(alert.baseline)


def test_low_entropy_without_repetition_is_not_a_loop_but_the_static_rule_says_it_is() -> None:
    rng = np.random.default_rng(1)
    values = _code_like(rng, 300)
    ids = rng.integers(0, 30_000, size=300).tolist()
    record = tokens("code", values, token_hashes=pack_token_hashes(ids))
    assert any(a.rule == LOOP for a in EntropyAnomalyDetector().process(record))  # static: flagged
    assert [a for a in _detector().process(record) if a.rule == LOOP] == []
    entropy_only = tokens("code2", values)
    assert [a for a in _detector().process(entropy_only) if a.rule == LOOP] == []


def test_a_token_id_cycle_is_a_loop_with_its_period_and_repeats() -> None:
    rng = np.random.default_rng(2)
    for period in (1, 5, 12):
        head = _code_like(rng, 40)
        head_ids = rng.integers(0, 30_000, size=40).tolist()
        loop_values, loop_ids = _loop(period, 60, rng)
        record = tokens(f"loop-{period}", head + loop_values,
                        token_hashes=pack_token_hashes(head_ids + loop_ids))
        (alert,) = [a for a in _detector().process(record) if a.rule == LOOP]
        evidence = _evidence(alert)
        assert evidence["evidence"] == "token_ids" and evidence["period"] == period
        assert evidence["repeats"] >= 60 / period - 1
        assert evidence["rule"] == LOOP and evidence["static"] is None  # no low-entropy run needed
        start, end = evidence["stretch"]
        assert 38 <= start <= 41 and end == 100
        assert f"period {period}" in alert.detail


def test_the_same_low_run_with_shuffled_ids_is_not_a_loop() -> None:
    rng = np.random.default_rng(3)
    loop_values, loop_ids = _loop(4, 60, rng)
    shuffled = rng.integers(0, 30_000, size=60).tolist()
    assert [a.rule for a in _detector().process(tokens("real", loop_values, token_hashes=pack_token_hashes(loop_ids)))] == [LOOP]
    assert _detector().process(tokens("fake", loop_values, token_hashes=pack_token_hashes(shuffled))) == []


def test_entropies_alone_confirm_a_loop_by_their_own_periodicity() -> None:
    rng = np.random.default_rng(4)
    loop_values, _ = _loop(7, 70, rng)
    (alert,) = _detector().process(tokens("periodic", _code_like(rng, 30) + loop_values))
    evidence = _evidence(alert)
    assert evidence["evidence"] == "entropy_periodicity" and evidence["period"] == 7
    assert evidence["autocorrelation"] > 0.8
    # The same entropies in a random order: low, but not periodic.
    shuffled = list(rng.permutation(loop_values))
    assert [a for a in _detector().process(tokens("shuffled", shuffled)) if a.rule == LOOP] == []


def test_periodicity_finders_report_the_smallest_period_and_refuse_short_stretches() -> None:
    ids = np.array([9, 1, 2, 3] * 6 + [7, 8], dtype=np.uint32)
    found = find_id_period(ids, np.zeros(ids.size), max_period=12, min_repeats=3, min_tokens=12)
    assert found is not None and found.period == 4 and (found.start, found.end) == (0, 24)
    assert find_id_period(ids[:10], np.zeros(10), 12, 3, 12) is None  # 10 tokens < min_tokens
    values = np.array([0.1, 0.5, 0.9] * 10, dtype=np.float32)
    found = find_entropy_period(values, 12, 3, 24, 0.05, 0.1)
    assert found is not None and found.period == 3 and found.repeats == 10


def _normal(rng: np.random.Generator, level: float, n: int = 200) -> list[float]:
    return [float(x) for x in np.clip(rng.normal(level, 0.6, size=n), 0.05, 10)]


def test_a_model_whose_band_is_high_is_not_gibberish_where_a_chatty_model_would_be() -> None:
    rng = np.random.default_rng(5)
    detector = _detector(min_requests=20)
    for i in range(30):  # warm-up: learned even though above the cold-start floor
        detector.process(tokens(f"hot-{i}", _normal(rng, 7.0), model="hot"))
        detector.process(tokens(f"chat-{i}", _normal(rng, 3.5), model="chat"))
    same = _normal(rng, 3.5, 100) + _normal(rng, 7.0, 60) + _normal(rng, 3.5, 40)
    assert [a for a in detector.process(tokens("hot-x", same, model="hot")) if a.rule == GIBBERISH] == []
    (alert,) = [a for a in detector.process(tokens("chat-x", same, model="chat")) if a.rule == GIBBERISH]
    evidence = _evidence(alert)
    assert evidence["evidence"] == "above_band" and evidence["band"]["n"] == 30
    assert evidence["level"] > evidence["edge"] >= 6.5


def test_short_spikes_are_normal_a_sustained_stretch_is_gibberish() -> None:
    rng = np.random.default_rng(6)
    base = _normal(rng, 3.5, 200)
    spiky = list(base)
    for at in (20, 60, 120):
        spiky[at:at + 5] = [8.0] * 5  # names and numbers: 5 uncertain tokens, static rule fires
    assert any(a.rule == GIBBERISH for a in EntropyAnomalyDetector().process(tokens("s0", spiky)))
    assert _detector().process(tokens("s1", spiky)) == []
    sustained = list(base)
    sustained[80:120] = [float(x) for x in rng.uniform(6.5, 9.5, size=40)]
    (alert,) = _detector().process(tokens("g", sustained))
    assert alert.rule == GIBBERISH and _evidence(alert)["evidence"] == "sustained_level"


def test_bands_learn_only_unflagged_requests_once_warm_and_are_used_after_tens() -> None:
    rng = np.random.default_rng(7)
    detector = _detector(min_requests=20)
    bands = detector.evidence.bands  # type: ignore[union-attr]
    for i in range(19):
        detector.process(tokens(f"n{i}", _normal(rng, 3.5), model="m"))
    assert bands.band("m", "default") is None
    detector.process(tokens("n19", _normal(rng, 3.5), model="m"))
    band = bands.band("m", "default")
    assert band is not None and band.requests == 20 and 3.0 < band.high < 5.0
    gibberish = _normal(rng, 3.5, 50) + [float(x) for x in rng.uniform(7, 9.5, size=150)]
    for i in range(20):
        assert [a.rule for a in detector.process(tokens(f"g{i}", gibberish, model="m"))] == [GIBBERISH]
    after = bands.band("m", "default")
    assert after is not None and after.requests == 20 and after.high == band.high


def test_from_settings_turns_the_evidence_on_and_off() -> None:
    assert EntropyAnomalyDetector.from_settings(Settings(entropy_evidence=True)).evidence is not None
    assert EntropyAnomalyDetector.from_settings(Settings(entropy_evidence=False)).evidence is None
    assert EntropyAnomalyDetector.from_settings(Settings()).evidence is not None  # on by default


def test_every_default_alert_on_the_fleet_names_its_evidence() -> None:
    """Evidence mode is the default: each alert on the fleet's traffic says which rule nominated it,
    what evidence confirmed it (the repetition period for a loop, the level over the edge for
    gibberish) and the (model, route)'s band once there is one."""
    from entroloop.collectors.synthetic_fleet import SyntheticFleet

    from entroloop.contract.records import TokenEntropy

    records = [r for q in SyntheticFleet(seed=5).requests(900) for r in q.records if isinstance(r, TokenEntropy)]
    alerts = [a for a in EntropyAnomalyDetector.from_settings(Settings()).process_batch(records) if isinstance(a, Alert)]
    assert {a.rule for a in alerts} == {LOOP, GIBBERISH}
    banded = 0
    for alert in alerts:
        evidence = json.loads(alert.baseline)
        # a low or high run nominated it ("static:..."), or, with token ids, the repetition alone did
        assert evidence["rule"] == alert.rule
        assert evidence["static"] is None if evidence.get("evidence") == "token_ids" else evidence["static"].startswith("static:")
        assert "band" in evidence
        banded += evidence["band"] is not None
        if alert.rule == LOOP:
            assert evidence["evidence"] == "token_ids" and 1 <= evidence["period"] <= 8 and evidence["repeats"] >= 3
            assert f"period {evidence['period']}" in alert.detail
        else:
            assert evidence["evidence"] in ("sustained_level", "above_band") and evidence["level"] > evidence["edge"]
            assert f"sustained {evidence['level']}" in alert.detail
    assert banded > len(alerts) // 2  # after warm-up the band is in the alert
