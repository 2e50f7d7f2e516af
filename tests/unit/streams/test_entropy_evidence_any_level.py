"""Loops and gibberish whatever the entropy level: a real model's loops run at its ordinary entropy
(tests/data/entropy/README.md: ~3.5 nats), and the tap's entropy is measured before temperature,
so high-temperature gibberish barely raises it. Loops are then told by repetition (token ids, or
the entropy sequence itself), gibberish by the sampled tokens' surprisal.

Each case is paired with its mirror (the same entropies without the repetition or the surprise, or
the static rule alone), so a test fails if the evidence stops mattering."""

from __future__ import annotations

import json

import numpy as np
from entroloop.streams.entropy_anomaly import GIBBERISH, LOOP, EntropyAnomalyDetector
from entroloop.streams.entropy_bands import EntropyBands
from entroloop.streams.entropy_evidence import EntropyEvidence
from entroloop.streams.periodicity import periodic_stretches

from entroloop.contract.records import Alert, pack_entropies, pack_token_hashes

from .analytics_records import tokens

# One cycle of a tiny LM's greedy loop through a message boundary: unsure where a message starts
# (~6 nats), sure inside it. Mean ~3.4 nats: never a low-entropy run.
CYCLE = [6.1, 0.9, 2.6, 4.8, 1.6, 3.9, 5.5, 2.2]


def _detector() -> EntropyAnomalyDetector:
    return EntropyAnomalyDetector(evidence=EntropyEvidence(bands=EntropyBands(min_requests=20)))


def _ordinary(rng: np.random.Generator, n: int) -> list[float]:
    return [float(x) for x in np.clip(rng.normal(3.5, 1.2, size=n), 0.3, 8.0)]


def _loops(alerts: list) -> list[Alert]:
    return [a for a in alerts if isinstance(a, Alert) and a.rule == LOOP]


def test_a_token_cycle_at_ordinary_entropy_is_a_loop_that_the_low_entropy_rule_never_sees() -> None:
    rng = np.random.default_rng(11)
    head = _ordinary(rng, 40)
    loop = [v + float(rng.uniform(-0.02, 0.02)) for v in CYCLE * 10]
    ids = rng.integers(0, 4096, size=40).tolist() + rng.integers(0, 4096, size=8).tolist() * 10
    record = tokens("lm-loop", head + loop, token_hashes=pack_token_hashes(ids))
    assert _loops(EntropyAnomalyDetector().process(record)) == []  # the static rule alone: no run below 1.5
    (alert,) = _loops(_detector().process(record))
    evidence = json.loads(alert.baseline)
    assert evidence["evidence"] == "token_ids" and evidence["period"] == 8 and evidence["static"] is None
    assert 3.0 < evidence["stretch_mean"] < 4.0 and evidence["repeats"] >= 9.5
    assert alert.token_end == 120 and alert.token_start <= 41 and alert.value == alert.token_end - alert.token_start
    assert "period 8" in alert.detail and "token ids" in alert.detail
    # the same entropies, the ids not repeating: ids decide, so no loop (the entropies are not consulted)
    fresh = rng.integers(0, 4096, size=120).tolist()
    assert _loops(_detector().process(tokens("fresh", head + loop, token_hashes=pack_token_hashes(fresh)))) == []


def test_entropies_alone_that_repeat_with_structure_are_a_loop_flat_or_shuffled_ones_are_not() -> None:
    rng = np.random.default_rng(12)
    head = _ordinary(rng, 40)
    loop = [v + float(rng.uniform(-0.03, 0.03)) for v in CYCLE * 8]
    (alert,) = _loops(_detector().process(tokens("periodic", head + loop)))
    evidence = json.loads(alert.baseline)
    assert evidence["evidence"] == "entropy_periodicity" and evidence["period"] == 8 and evidence["static"] is None
    assert "entropy sequence" in alert.detail
    shuffled = head + [float(x) for x in rng.permutation(loop)]
    assert _loops(_detector().process(tokens("shuffled", shuffled))) == []
    # a flat stretch matches itself at every lag: that is a steady model, not a repetition
    flat = head + [3.4 + float(rng.uniform(-0.05, 0.05)) for _ in range(64)]
    assert _loops(_detector().process(tokens("flat", flat))) == []


def test_surprising_tokens_are_gibberish_at_an_ordinary_entropy_ordinary_surprise_is_not() -> None:
    rng = np.random.default_rng(13)
    values = _ordinary(rng, 160)
    ordinary = [max(0.0, v + float(rng.normal(-0.3, 1.0))) for v in values]  # T<=1: about the entropy
    hot = list(ordinary)
    hot[60:140] = [v + float(rng.uniform(2.5, 6.0)) for v in values[60:140]]  # T=2: far above it
    record = tokens("hot", values, surprisals=pack_entropies(hot))
    assert [a for a in EntropyAnomalyDetector(gibberish_threshold=6.5).process(record)
            if a.rule == GIBBERISH] == []  # entropy never sustains a high run
    (alert,) = [a for a in _detector().process(record) if a.rule == GIBBERISH]
    evidence = json.loads(alert.baseline)
    assert evidence["evidence"] == "surprisal" and evidence["static"] is None
    assert evidence["level"] > evidence["edge"] == 1.85 and evidence["window"] == 32
    assert 50 <= alert.token_start <= 75 and 125 <= alert.token_end <= 160
    assert evidence["stretch_surprisal"] > evidence["stretch_entropy"] + 2
    assert "more surprising" in alert.detail
    calm = tokens("calm", values, surprisals=pack_entropies(ordinary))
    assert [a for a in _detector().process(calm) if a.rule == GIBBERISH] == []


def test_a_sampler_far_flatter_than_the_model_is_gibberish_without_token_ids_a_cool_one_is_not() -> None:
    """Sampling entropies (the entropy at the request's temperature) need no token ids: a stretch
    sampled much flatter than the model's own distribution is gibberish; T = 1 (equal to the
    entropy) and T < 1 (below it) are not, and neither is the same record without them."""
    rng = np.random.default_rng(15)
    values = _ordinary(rng, 160)
    hot = list(values)
    hot[50:150] = [v + float(rng.uniform(1.2, 3.0)) for v in values[50:150]]  # T=1.5..2 on that stretch
    record = tokens("hot-sampler", values, sampling_entropies=pack_entropies(hot))
    (alert,) = [a for a in _detector().process(record) if a.rule == GIBBERISH]
    evidence = json.loads(alert.baseline)
    assert evidence["evidence"] == "sampling_entropy" and evidence["static"] is None
    assert evidence["level"] > evidence["edge"] == 0.95 and evidence["window"] == 32
    assert 40 <= alert.token_start <= 70 and 130 <= alert.token_end <= 160
    assert evidence["stretch_sampling_entropy"] > evidence["stretch_entropy"] + 1
    assert "flatter than the model's own" in alert.detail
    cool = [max(0.0, v * 0.6) for v in values]
    for name, sampling in (("t1", values), ("cool", cool)):
        calm = tokens(name, values, sampling_entropies=pack_entropies(sampling))
        assert [a for a in _detector().process(calm) if a.rule == GIBBERISH] == []
    assert [a for a in _detector().process(tokens("without", values)) if a.rule == GIBBERISH] == []


def test_a_lost_model_is_still_gibberish_by_its_level_when_its_surprise_is_ordinary() -> None:
    """Surprisal adds evidence, it does not replace the level: a model near-uniform over its
    vocabulary, sampled as it is, surprises itself no more than it expects."""
    rng = np.random.default_rng(14)
    values = _ordinary(rng, 60) + [float(x) for x in rng.uniform(7.5, 9.5, size=80)]
    record = tokens("lost", values, surprisals=pack_entropies(values))
    (alert,) = [a for a in _detector().process(record) if a.rule == GIBBERISH]
    assert json.loads(alert.baseline)["evidence"] == "sustained_level"


def test_batch_periodicity_never_crosses_a_record_edge_and_picks_the_longest_stretch() -> None:
    a = np.array([5, 6, 7] * 4, dtype=np.uint32)  # 12 tokens, period 3
    b = np.array([1, 2, 3, 4, 5, 6], dtype=np.uint32)  # nothing
    c = np.array([8, 9] * 3 + [4, 4, 4, 4, 4, 4, 4, 4, 4], dtype=np.uint32)  # period 2 x3, then 9 of one id
    flat = np.concatenate([a, b, c, a[:3]])  # the last record alone is one cycle: not a loop
    bounds = np.array([0, 12, 18, 33, 36])
    found = periodic_stretches(flat, bounds, max_period=6, min_repeats=3, min_tokens=6)
    assert set(found) == {0, 2}
    assert (found[0].period, found[0].start, found[0].end) == (3, 0, 12)
    assert (found[2].period, found[2].start, found[2].end) == (1, 6, 15)
    # entropies: a flat stretch is passed over when a spread is required
    values = np.array([2.0] * 12 + [0.5, 3.0, 6.0] * 4, dtype=np.float32)
    spread = periodic_stretches(values, np.array([0, 24]), 6, 3, 9, tolerance=(0.1, 0.0), min_spread=0.5)
    assert (spread[0].period, spread[0].start, spread[0].end) == (3, 12, 24)
    assert periodic_stretches(values[:12], np.array([0, 12]), 6, 3, 9, tolerance=(0.1, 0.0), min_spread=0.5) == {}


def test_the_prefilter_keeps_a_loop_whose_entropies_straddle_a_cell_edge() -> None:
    """The prefilter puts entropies into cells twice the tolerance wide; values that match within
    the tolerance but sit either side of a cell edge (0.6, 3.0, 6.0 for a 0.1 tolerance) must still
    reach the exact comparison (the offset grid holds them together)."""
    cycles = [[0.59, 3.01, 5.99] if i % 2 else [0.61, 2.99, 6.01] for i in range(8)]
    values = np.array([v for cycle in cycles for v in cycle], dtype=np.float32)
    noise = np.random.default_rng(15).uniform(0.5, 6.0, 40).astype(np.float32)
    flat = np.concatenate([noise, values])
    # max_period 4: the same side of an edge comes back only every 6 tokens, beyond it
    found = periodic_stretches(flat, np.array([0, 40, 64]), 4, 3, 12, tolerance=(0.1, 0.0), min_spread=0.5)
    assert 1 in found and found[1].period == 3 and found[1].length == 24


def test_a_loop_that_repeats_with_changes_is_a_near_cycle_alert_exact_periods_alone_miss_it() -> None:
    """Two lines alternating in no fixed order (the tiny LM's "%s: 无此目录" / "%s: 无此文件"): no exact
    period holds over 16 tokens, but nearly every token copies the text a line or two back."""
    from entroloop.streams.entropy_evidence import EvidenceConfig

    rng = np.random.default_rng(13)
    first, second = [71, 72, 73, 74, 75, 10], [71, 72, 73, 74, 76, 10]
    order = [first, second, first, second, second, first, first, second, first, first, second, second, first]
    head_ids = rng.integers(1000, 4096, size=30).tolist()
    ids = head_ids + [t for line in order for t in line]
    entropies = _ordinary(rng, len(ids))
    record = tokens("near-cycle", entropies, token_hashes=pack_token_hashes(ids))
    (alert,) = _loops(_detector().process(record))
    evidence = json.loads(alert.baseline)
    assert evidence["evidence"] == "near_cycle" and evidence["period"] in (6, 12) and evidence["static"] is None
    assert alert.token_end == len(ids) and 24 <= alert.token_start <= 36
    assert "keep copying the text" in alert.detail and "4-gram" in alert.detail
    exact_only = EntropyAnomalyDetector(evidence=EntropyEvidence(EvidenceConfig(loop_template_lookback=0),
                                                                 bands=EntropyBands(min_requests=20)))
    assert _loops(exact_only.process(record)) == []
    # the same lines in an order that never comes back three times: a list, not a loop
    listed = head_ids + [t for k in range(8) for t in [71, 72, 300 + 7 * k, 301 + 7 * k, 302 + 7 * k, 10]]
    assert _loops(_detector().process(tokens("list", _ordinary(rng, len(listed)),
                                             token_hashes=pack_token_hashes(listed)))) == []
