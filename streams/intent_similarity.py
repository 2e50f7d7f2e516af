"""Intent similarity: does the answer address the question? Cosine of their embeddings.

The query and the answer of each ``Audit`` are embedded by a pluggable ``Embedder`` (anything
with ``embed(texts) -> (n, d) L2-normalised array`` and a ``name``) and scored by cosine
similarity. Work is micro-batched: ``process_batch`` embeds all texts of a batch in one call
(deduplicated), and query embeddings live in an LRU cache because users repeat questions far more
often than models repeat answers.

Thresholds: ``satisfied_threshold`` (0.68, a typical satisfied answer) and ``fallback_threshold``
(0.55: below it a ``Fallback`` with ``source="intent"`` is emitted). The default model
(all-MiniLM-L6-v2) is English-centric, so thresholds are also kept per language, detected per
request (``detect_language``: script ratios, no dependency) and calibrated from labelled pairs
with ``calibrate`` / ``calibrate_scores`` (the threshold that maximises balanced accuracy).

The real embedders live in ``streams.embedders`` (sentence-transformers on torch, the reference;
the same model on ONNX Runtime, fp32 or int8, the fast path; chosen by
``ENTROLOOP_INTENT_BACKEND``). They import their libraries lazily, so this module (and the scorer
with a test embedder) works in the light ``.venv``.
"""

from __future__ import annotations

from collections import OrderedDict, defaultdict
from collections.abc import Iterable, Mapping, Sequence

import msgspec
import numpy as np

from entroloop.contract.records import Audit, Event, Fallback, IntentScore
from entroloop.contract.settings import Settings
from streams.base import Processor, derive
from streams.embedders import (  # re-exported: the embedders used to live here
    Embedder,
    OnnxEmbedder,
    SentenceTransformerEmbedder,
    bundled_minilm_path,
    make_embedder,
)

# --- language detection ----------------------------------------------------------------------


def detect_language(text: str) -> str:
    """``zh``, ``ja``, ``ko``, ``en`` or ``other`` from the share of each script among letters.

    Japanese is told from Chinese by kana, which Chinese text never uses; Latin-script text is
    reported as ``en`` because thresholds are calibrated per model language coverage, and the
    English-centric default model treats other Latin languages much like English.
    """
    han = kana = hangul = latin = other = 0
    for ch in text:
        code = ord(ch)
        if 0x4E00 <= code <= 0x9FFF or 0x3400 <= code <= 0x4DBF or 0xF900 <= code <= 0xFAFF:
            han += 1
        elif 0x3040 <= code <= 0x30FF:
            kana += 1
        elif 0xAC00 <= code <= 0xD7AF:
            hangul += 1
        elif ch.isascii() and ch.isalpha():
            latin += 1
        elif ch.isalpha():
            other += 1
    letters = han + kana + hangul + latin + other
    if letters == 0:
        return "other"
    # A CJK character carries about a word's worth of meaning, a Latin letter a fifth of one:
    # weight them so "用Python写一个排序" counts as Chinese.
    cjk = (han + kana + hangul) * 5
    if cjk >= latin + other * 5:
        if kana and kana * 5 >= han:
            return "ja"
        if hangul >= han + kana:
            return "ko"
        return "zh"
    if latin >= other:
        return "en"
    return "other"


# --- calibration -----------------------------------------------------------------------------


class LabelledPair(msgspec.Struct, frozen=True):
    """A query and an answer, labelled on-intent (the answer addresses the query) or not."""

    query: str
    answer: str
    on_intent: bool
    language: str = ""


def best_threshold(scores: Sequence[float], labels: Sequence[bool]) -> tuple[float, float]:
    """The threshold ``t`` (predict on-intent when score >= t) with the best balanced accuracy.

    Every cut between consecutive distinct scores is tried (and the cuts below all and above all);
    a cut is reported as the midpoint of its gap, and among tied cuts the median one is chosen,
    farthest from both error kinds. Returns (threshold, balanced accuracy). Needs both labels.
    """
    pos = sum(1 for label in labels if label)
    neg = len(labels) - pos
    if pos == 0 or neg == 0:
        raise ValueError("calibration needs both on-intent and off-intent pairs")
    order = sorted(zip(scores, labels, strict=True))
    distinct = sorted(set(scores))
    results = []
    # Sweep the cuts in order; cut k puts distinct[:k] below the threshold.
    i = below_pos = below_neg = 0
    for k in range(len(distinct) + 1):
        if k:
            while i < len(order) and order[i][0] <= distinct[k - 1]:
                below_pos += order[i][1]
                below_neg += not order[i][1]
                i += 1
        tpr = (pos - below_pos) / pos
        tnr = below_neg / neg
        results.append(((tpr + tnr) / 2, k))
    best = max(acc for acc, _ in results)
    ties = [k for acc, k in results if acc >= best - 1e-12]
    k = ties[len(ties) // 2]
    if k == 0:
        threshold = distinct[0]
    elif k == len(distinct):
        threshold = float(np.nextafter(distinct[-1], np.inf))
    else:
        low, high = distinct[k - 1], distinct[k]
        mid = (low + high) / 2
        # Adjacent floats have no midpoint strictly between them: fall back to the upper score.
        threshold = mid if low < mid <= high else high
    return threshold, best


def calibrate_scores(samples: Iterable[tuple[str, float, bool]]) -> dict[str, float]:
    """Per-language fallback thresholds from (language, similarity, on_intent) samples."""
    by_language: dict[str, tuple[list[float], list[bool]]] = defaultdict(lambda: ([], []))
    for language, score, label in samples:
        by_language[language][0].append(float(score))
        by_language[language][1].append(bool(label))
    return {lang: round(best_threshold(s, lab)[0], 4) for lang, (s, lab) in sorted(by_language.items())}


def calibrate(pairs: Iterable[LabelledPair], embedder: Embedder) -> dict[str, float]:
    """Embed labelled pairs and pick, per language, the threshold of best balanced accuracy.

    The result plugs into ``IntentSimilarityScorer(language_thresholds=...)`` or, as JSON, into
    ``ENTROLOOP_INTENT_LANGUAGE_THRESHOLDS``.
    """
    pairs = list(pairs)
    scores = similarities(embedder, [p.query for p in pairs], [p.answer for p in pairs])
    return calibrate_scores(
        (p.language or detect_language(p.query), float(s), p.on_intent)
        for p, s in zip(pairs, scores, strict=True)
    )


def similarities(embedder: Embedder, queries: list[str], answers: list[str]) -> np.ndarray:
    """Cosine similarity of each (query, answer), one embedder call for both sides."""
    vectors = embedder.embed([*queries, *answers])
    q, a = vectors[: len(queries)], vectors[len(queries) :]
    return np.einsum("ij,ij->i", q, a)


class LRUCache:
    """A bounded text -> vector cache; least recently used entries leave first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._items: OrderedDict[str, np.ndarray] = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> np.ndarray | None:
        vector = self._items.get(key)
        if vector is None:
            self.misses += 1
            return None
        self._items.move_to_end(key)
        self.hits += 1
        return vector

    def put(self, key: str, vector: np.ndarray) -> None:
        if self.capacity <= 0:
            return
        self._items[key] = vector
        self._items.move_to_end(key)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


# --- the processor ---------------------------------------------------------------------------


class IntentSimilarityScorer(Processor):
    """Score each ``Audit`` with the cosine similarity of its prompt and response embeddings.

    Output per audit: an ``IntentScore`` (``threshold`` = the fallback threshold applied for the
    request's language, ``language`` = the detected or given language, ``embedder`` = the model
    name); and, when the similarity is below that threshold, a ``Fallback`` with
    ``source="intent"``, ``from_tier="primary"``, ``to_tier="fallback"`` and a reason naming the
    score and the threshold.
    """

    name = "intent_similarity"
    inputs = (Audit,)

    def __init__(
        self,
        embedder: Embedder,
        satisfied_threshold: float = 0.68,
        fallback_threshold: float = 0.55,
        language_thresholds: Mapping[str, float] | None = None,
        cache_size: int = 10_000,
        max_batch: int = 256,
    ) -> None:
        if fallback_threshold > satisfied_threshold:
            raise ValueError("fallback_threshold must not exceed satisfied_threshold")
        self.embedder = embedder
        self.satisfied_threshold = satisfied_threshold
        self.fallback_threshold = fallback_threshold
        self.language_thresholds = dict(language_thresholds or {})
        self.cache = LRUCache(cache_size)
        self.max_batch = max_batch
        self.scored = 0
        self.fallbacks = 0

    @classmethod
    def from_settings(cls, settings: Settings, embedder: Embedder | None = None) -> IntentSimilarityScorer:
        return cls(
            embedder=embedder
            or make_embedder(
                settings.intent_backend,
                settings.intent_model_path,
                batch_size=settings.intent_batch_size,
                max_tokens=settings.intent_max_tokens,
                threads=settings.intent_threads,
                cache_dir=settings.intent_onnx_cache_dir,
            ),
            satisfied_threshold=settings.intent_satisfied_threshold,
            fallback_threshold=settings.intent_fallback_threshold,
            language_thresholds=settings.intent_language_thresholds,
            cache_size=settings.intent_cache_size,
        )

    def threshold_for(self, language: str) -> float:
        return self.language_thresholds.get(language, self.fallback_threshold)

    def verdict(self, similarity: float, language: str) -> str:
        """``satisfied``, ``uncertain`` or ``fallback`` for a score in a language."""
        if similarity < self.threshold_for(language):
            return "fallback"
        return "satisfied" if similarity >= self.satisfied_threshold else "uncertain"

    def process(self, record: Event) -> list[Event]:
        return self.process_batch([record])

    def process_batch(self, records: Sequence[Event]) -> list[Event]:
        # a large audit in parts is scored once, on its first part: intent shows at the start
        audits = [r for r in records if isinstance(r, Audit) and not r.part_index]
        out: list[Event] = []
        for i in range(0, len(audits), self.max_batch):
            out.extend(self._score(audits[i : i + self.max_batch]))
        return out

    def _score(self, audits: list[Audit]) -> list[Event]:
        if not audits:
            return []
        query_vectors: dict[str, np.ndarray] = {}
        to_embed: dict[str, None] = {}  # ordered set of texts the model must see
        for audit in audits:
            if audit.prompt not in query_vectors:
                cached = self.cache.get(audit.prompt)
                if cached is not None:
                    query_vectors[audit.prompt] = cached
                else:
                    to_embed[audit.prompt] = None
        for audit in audits:
            to_embed[audit.response] = None
        texts = list(to_embed)
        vectors = self.embedder.embed(texts) if texts else np.zeros((0, 0), dtype=np.float32)
        by_text = dict(zip(texts, vectors, strict=True))
        prompts = {a.prompt for a in audits}
        for text in texts:
            if text in prompts and text not in query_vectors:
                query_vectors[text] = by_text[text]
                self.cache.put(text, by_text[text])
        q = np.stack([query_vectors[a.prompt] for a in audits])
        r = np.stack([by_text[a.response] for a in audits])
        scores = np.einsum("ij,ij->i", q, r)
        out: list[Event] = []
        for audit, score in zip(audits, scores, strict=True):
            similarity = float(np.clip(score, -1.0, 1.0))
            language = audit.language or detect_language(audit.prompt)
            threshold = self.threshold_for(language)
            out.append(
                derive(
                    audit,
                    IntentScore,
                    0,
                    self.name,
                    model=audit.model,
                    similarity=similarity,
                    route=audit.route,
                    language=language,
                    embedder=self.embedder.name,
                    threshold=threshold,
                )
            )
            self.scored += 1
            if similarity < threshold:
                self.fallbacks += 1
                fallback = derive(
                    audit,
                    Fallback,
                    1,
                    self.name,
                    model=audit.model,
                    reason=f"intent similarity {similarity:.3f} < fallback threshold "
                    f"{threshold:.3f} (language {language}, embedder {self.embedder.name})",
                    route=audit.route,
                    from_tier="primary",
                    to_tier="fallback",
                )
                # derive()'s first parameter is named `source`, which shadows Fallback.source as a
                # keyword: set it afterwards.
                out.append(msgspec.structs.replace(fallback, source="intent"))
        return out


__all__ = [
    "Embedder",
    "IntentSimilarityScorer",
    "LRUCache",
    "LabelledPair",
    "OnnxEmbedder",
    "SentenceTransformerEmbedder",
    "best_threshold",
    "bundled_minilm_path",
    "calibrate",
    "calibrate_scores",
    "detect_language",
    "make_embedder",
    "similarities",
]
