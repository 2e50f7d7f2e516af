"""The synthetic fleet behaves like real traffic: entropy bands, long tails, both languages, labels."""

from __future__ import annotations

import numpy as np

from collectors.synthetic_fleet import SyntheticFleet
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
