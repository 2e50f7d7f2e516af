"""The synthetic fleet behaves like real traffic: entropy bands, long tails, both languages, labels."""

from __future__ import annotations

import numpy as np
from entroloop.collectors.synthetic_fleet import SyntheticFleet

from entroloop.contract.records import Audit, TokenEntropy


def test_normal_tokens_mostly_within_the_brief_band_and_not_constant():
    fleet = SyntheticFleet(seed=1)
    values = fleet.normal_entropies(20_000, 2.9)
    inside = np.mean((values >= 2.1) & (values <= 3.8))
    assert 0.85 <= inside < 1.0
    assert values.std() > 0.2


def test_injected_runs_match_their_labels():
    fleet = SyntheticFleet(seed=3)
    loops = gibberish = 0
    for req in fleet.requests(600):
        ent = np.concatenate([r.values() for r in req.records if isinstance(r, TokenEntropy)]).astype(float)
        assert len(ent) == req.labels.n_tokens
        for start, end in req.labels.loops:
            loops += 1
            assert (ent[start:end] < 1.5).all() and end - start >= 12
        for start, end in req.labels.gibberish:
            gibberish += 1
            assert (ent[start:end] > 4.5).all()
    assert loops > 5 and gibberish > 5


def test_traffic_mixes_languages_models_and_long_tailed_lengths():
    reqs = list(SyntheticFleet(seed=5).requests(1000))
    audits = [next(r for r in q.records if isinstance(r, Audit)) for q in reqs]
    assert {a.language for a in audits} == {"zh", "en"}
    assert len({a.model for a in audits}) >= 3
    lengths = np.array([q.labels.n_tokens for q in reqs])
    assert np.percentile(lengths, 99) > 3 * np.median(lengths)


def test_long_generations_are_chunked():
    fleet = SyntheticFleet(seed=9)
    fleet.config = type(fleet.config)(chunk_tokens=16)
    req = fleet.request()
    chunks = [r for r in req.records if isinstance(r, TokenEntropy)]
    assert sum(c.n_tokens for c in chunks) == req.labels.n_tokens
    assert chunks[-1].final and not any(c.final for c in chunks[:-1])


def test_per_node_seq_is_gapless_and_same_seed_same_traffic():
    a = [r.model for q in SyntheticFleet(seed=11).requests(50) for r in q.records if isinstance(r, Audit)]
    b = [r.model for q in SyntheticFleet(seed=11).requests(50) for r in q.records if isinstance(r, Audit)]
    assert a == b
    seqs: dict[str, list[int]] = {}
    for q in SyntheticFleet(seed=11).requests(200):
        for r in q.records:
            seqs.setdefault(r.node_id, []).append(r.seq)
    for node, s in seqs.items():
        assert s == list(range(len(s))), node


def _tokens(req) -> tuple[np.ndarray, np.ndarray]:
    chunks = [r for r in req.records if isinstance(r, TokenEntropy)]
    assert all(c.hashes() is not None and c.hashes().size == c.n_tokens for c in chunks), "every record carries ids"
    return (np.concatenate([c.values() for c in chunks]).astype(float),
            np.concatenate([c.hashes() for c in chunks]).astype(np.int64))


def test_loops_are_token_cycles_with_periodic_entropies_and_normal_text_has_no_cycle() -> None:
    loops = 0
    for req in SyntheticFleet(seed=3).requests(800):
        ent, ids = _tokens(req)
        for start, end in req.labels.loops:
            loops += 1
            run_ids, run_ent = ids[start:end], ent[start:end]
            period = next(p for p in range(1, 9) if (run_ids[p:] == run_ids[:-p]).all())
            assert end - start >= min(24, req.labels.n_tokens) and (end - start) >= 3 * period
            assert np.abs(run_ent[period:] - run_ent[:-period]).max() < 0.1  # same context, same entropy
        normal = np.ones(ids.size, bool)
        for start, end in req.labels.loops + req.labels.gibberish:
            normal[start:end] = False
        for lag in range(1, 13):  # no id repeats at a short lag outside the injected runs
            both = normal[lag:] & normal[:-lag]
            assert (ids[lag:][both] == ids[:-lag][both]).sum() <= 1
        for start, end in req.labels.gibberish:
            assert end - start >= min(20, req.labels.n_tokens) and (ent[start:end] > 6.9).all()
    assert loops > 10


def test_ids_do_not_change_the_rest_of_a_seeded_fleet() -> None:
    """Ids come from their own random stream: lengths, pathologies and feedback are what they were
    (the first requests of seed 11, recorded before ids existed)."""
    reqs = list(SyntheticFleet(seed=11).requests(300))
    assert [q.labels.n_tokens for q in reqs[:8]] == [74, 81, 164, 25, 102, 999, 584, 28]
    assert [i for i, q in enumerate(reqs) if q.labels.loops] == [70, 98, 128, 141, 174, 210, 232]
    assert [q.labels.loops[0] for q in reqs if q.labels.loops][:4] == [(55, 171), (252, 349), (1, 49), (0, 44)]
    assert sum(q.labels.corrected for q in reqs) == 20 and sum(q.labels.fallback for q in reqs) == 7
