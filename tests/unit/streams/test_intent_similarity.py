"""IntentSimilarityScorer with a deterministic fake embedder (the real model runs in .venv-ml)."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
from entroloop.streams.intent_similarity import (
    IntentSimilarityScorer,
    LabelledPair,
    LRUCache,
    best_threshold,
    calibrate,
    calibrate_scores,
    detect_language,
)
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from entroloop.contract.records import Fallback, IntentScore

from .analytics_records import audit


class FakeEmbedder:
    """Deterministic embedder: texts that share a 'topic:' prefix point the same way.

    A text "topic:rest" embeds as unit(base(topic) + noise(rest) * weight), where weight is the
    number of '!' characters in the text: so tests dial the similarity they need.
    """

    name = "fake"

    def __init__(self) -> None:
        self.calls: list[list[str]] = []

    @staticmethod
    def _vec(seed: str) -> np.ndarray:
        digest = hashlib.sha256(seed.encode()).digest()
        return np.random.default_rng(int.from_bytes(digest[:8], "little")).standard_normal(32)

    def embed(self, texts: list[str]) -> np.ndarray:
        self.calls.append(list(texts))
        rows = []
        for text in texts:
            topic = text.split(":", 1)[0]
            v = self._vec(topic) + self._vec(text) * text.count("!")
            rows.append(v / np.linalg.norm(v))
        return np.asarray(rows, dtype=np.float32)


def test_on_topic_answer_scores_high_and_emits_no_fallback() -> None:
    scorer = IntentSimilarityScorer(FakeEmbedder())
    (score,) = scorer.process(audit("r1", prompt="weather:today?", response="weather:sunny", model="m1"))
    assert isinstance(score, IntentScore)
    assert score.similarity > 0.99 and score.language == "en" and score.embedder == "fake"
    assert score.threshold == 0.55 and score.model == "m1"


def test_off_topic_answer_emits_fallback_with_reason() -> None:
    scorer = IntentSimilarityScorer(FakeEmbedder())
    score, fallback = scorer.process(audit("r2", prompt="weather:today?", response="stocks:up"))
    assert isinstance(fallback, Fallback)
    assert fallback.source == "intent" and fallback.request_id == "r2"
    assert f"{score.similarity:.3f}" in fallback.reason and "0.550" in fallback.reason
    assert scorer.fallbacks == 1


def test_threshold_boundary_is_strictly_below() -> None:
    embedder = FakeEmbedder()
    scorer = IntentSimilarityScorer(embedder)
    (s,) = scorer.process(audit("x", prompt="t:a", response="t:b!"))
    at = IntentSimilarityScorer(embedder, fallback_threshold=s.similarity, satisfied_threshold=1.0)
    assert len(at.process(audit("x", prompt="t:a", response="t:b!"))) == 1  # equal: no fallback
    above = IntentSimilarityScorer(embedder, fallback_threshold=s.similarity + 1e-6, satisfied_threshold=1.0)
    assert len(above.process(audit("x", prompt="t:a", response="t:b!"))) == 2


def test_per_language_thresholds() -> None:
    scorer = IntentSimilarityScorer(FakeEmbedder(), language_thresholds={"zh": 0.2})
    a_zh = audit("z", prompt="天气:今天怎么样", response="天气:晴!!")
    a_en = audit("e", prompt="weather:today", response="weather:sunny!!")
    scores = [r for r in scorer.process_batch([a_zh, a_en]) if isinstance(r, IntentScore)]
    zh, en = scores
    assert zh.language == "zh" and zh.threshold == 0.2
    assert en.language == "en" and en.threshold == 0.55
    # Audit.language, when the gateway set it, wins over detection.
    (given,) = scorer.process(audit("g", prompt="weather:x", response="weather:y", language="zh"))
    assert given.language == "zh" and given.threshold == 0.2


def test_batch_embeds_once_with_deduplicated_texts_and_caches_queries() -> None:
    embedder = FakeEmbedder()
    scorer = IntentSimilarityScorer(embedder, cache_size=10)
    batch = [audit(f"r{i}", prompt="faq:hours", response=f"faq:open {i}") for i in range(5)]
    out = scorer.process_batch(batch)
    assert len([r for r in out if isinstance(r, IntentScore)]) == 5
    assert len(embedder.calls) == 1
    assert embedder.calls[0].count("faq:hours") == 1 and len(embedder.calls[0]) == 6
    scorer.process_batch([audit("again", prompt="faq:hours", response="faq:open late")])
    assert embedder.calls[1] == ["faq:open late"]  # the query came from the cache
    assert scorer.cache.hits == 1


def test_batch_and_single_processing_agree() -> None:
    batch = [audit(f"r{i}", prompt=f"t{i % 3}:q", response=f"t{i % 2}:a!") for i in range(7)]
    together = IntentSimilarityScorer(FakeEmbedder(), max_batch=3).process_batch(batch)
    single = IntentSimilarityScorer(FakeEmbedder())
    one_by_one = [r for a in batch for r in single.process(a)]
    assert [r.event_id for r in together] == [r.event_id for r in one_by_one]
    sims = [r.similarity for r in together if isinstance(r, IntentScore)]
    assert sims == pytest.approx([r.similarity for r in one_by_one if isinstance(r, IntentScore)], abs=1e-6)


def test_lru_cache_evicts_least_recently_used() -> None:
    cache = LRUCache(2)
    cache.put("a", np.zeros(1))
    cache.put("b", np.zeros(1))
    cache.get("a")
    cache.put("c", np.zeros(1))
    assert cache.get("b") is None and cache.get("a") is not None and len(cache) == 2
    LRUCache(0).put("x", np.zeros(1))


@pytest.mark.parametrize(
    ("text", "language"),
    [
        ("How do I reset my password?", "en"),
        ("如何重置我的密码？", "zh"),
        ("用Python写一个排序函数", "zh"),
        ("パスワードをリセットするには？", "ja"),
        ("東京の天気は", "ja"),
        ("비밀번호를 재설정하려면?", "ko"),
        ("Привет, как дела?", "other"),
        ("12345 ???", "other"),
    ],
)
def test_detect_language(text: str, language: str) -> None:
    assert detect_language(text) == language


def test_best_threshold_separates_and_picks_the_middle_of_the_gap() -> None:
    t, acc = best_threshold([0.2, 0.3, 0.7, 0.8], [False, False, True, True])
    assert acc == 1.0 and t == pytest.approx(0.5)


def test_best_threshold_is_balanced_not_plain_accuracy() -> None:
    # 9 negatives spread high, 1 positive: plain accuracy would put the threshold above all.
    scores = [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.65, 0.7, 0.75, 0.9]
    labels = [False] * 9 + [True]
    t, acc = best_threshold(scores, labels)
    assert 0.75 < t < 0.9 and acc == 1.0
    with pytest.raises(ValueError):
        best_threshold([0.1, 0.2], [True, True])


def test_calibrate_per_language() -> None:
    samples = [("en", 0.8, True), ("en", 0.7, True), ("en", 0.3, False), ("en", 0.2, False),
               ("zh", 0.6, True), ("zh", 0.55, True), ("zh", 0.48, False), ("zh", 0.45, False)]
    thresholds = calibrate_scores(samples)
    assert thresholds == {"en": 0.5, "zh": 0.515}


def test_calibrate_embeds_pairs_and_detects_language() -> None:
    pairs = [
        LabelledPair("w:weather?", "w:sun", True),
        LabelledPair("w:weather?", "s:stocks!", False),
        LabelledPair("天:天气？", "天:晴", True),
        LabelledPair("天:天气？", "股:股票!", False),
    ]
    thresholds = calibrate(pairs, FakeEmbedder())
    assert set(thresholds) == {"en", "zh"}


@hsettings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(min_value=-1, max_value=1), st.booleans()), min_size=2, max_size=40))
def test_property_best_threshold_beats_every_candidate(samples: list[tuple[float, bool]]) -> None:
    scores = [s for s, _ in samples]
    labels = [label for _, label in samples]
    if all(labels) or not any(labels):
        return
    threshold, best = best_threshold(scores, labels)
    pos, neg = sum(labels), len(labels) - sum(labels)

    def balanced(t: float) -> float:
        tpr = sum(1 for s, lab in samples if lab and s >= t) / pos
        tnr = sum(1 for s, lab in samples if not lab and s < t) / neg
        return (tpr + tnr) / 2

    assert balanced(threshold) == pytest.approx(best)  # the returned threshold achieves it
    for t in [*scores, 2.0]:
        assert balanced(t) <= best + 1e-9


def test_a_sample_of_requests_is_scored_the_same_on_every_worker_and_replay() -> None:
    audits = [audit(f"req-{i}", prompt="weather:today?", response="weather:sunny") for i in range(2000)]
    sampled = IntentSimilarityScorer(FakeEmbedder(), sample_rate=0.1)
    scored = {s.request_id for s in sampled.process_batch(audits) if isinstance(s, IntentScore)}
    assert 150 <= len(scored) <= 250  # ~10%
    # another worker (or a replay) picks exactly the same requests, one at a time or in a batch
    again = IntentSimilarityScorer(FakeEmbedder(), sample_rate=0.1)
    assert {s.request_id for a in audits for s in again.process(a) if isinstance(s, IntentScore)} == scored
    everything = IntentSimilarityScorer(FakeEmbedder())
    assert len([s for s in everything.process_batch(audits) if isinstance(s, IntentScore)]) == 2000
    with pytest.raises(ValueError):
        IntentSimilarityScorer(FakeEmbedder(), sample_rate=0.0)
