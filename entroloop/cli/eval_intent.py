"""`entroloop eval intent FILE`: intent scoring on the user's labelled query/answer pairs.

Same shape as the other `eval` commands (entroloop/cli/eval.py): JSONL in, a table out, ``--json``
puts the figures on the last line, ``--predictions`` writes one line per input line. The pairs go
through the scorer the pipeline runs (``IntentSimilarityScorer.from_settings``: embedder, head,
cascade and thresholds from the same settings), so the figures and the ``best_threshold`` printed
here are the ones to put into ``ENTROLOOP_INTENT_LANGUAGE_THRESHOLDS``.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import msgspec

from entroloop.cli.eval import (
    AsJson,
    EvalInputError,
    InputFile,
    Predictions,
    emit_json,
    eval_app,
    fail,
    print_table,
    read_jsonl,
    write_predictions,
)


class IntentLine(msgspec.Struct):
    """A query, an answer and (optionally) whether the answer addresses the query."""

    query: str
    answer: str
    id: str | int | None = None
    lang: str | None = None
    on_intent: bool | None = None

    def check(self) -> str:
        if not self.query.strip():
            return "query is empty"
        if not self.answer.strip():
            return "answer is empty"
        return ""


def auroc(scores: Sequence[float], labels: Sequence[bool]) -> float:
    """Area under the ROC curve: the chance a random on-intent pair outscores a random off-intent
    one, ties counting half (Mann-Whitney U with mid-ranks). Needs both labels."""
    pos = sum(1 for label in labels if label)
    neg = len(labels) - pos
    if not pos or not neg:
        raise ValueError("AUROC needs both on-intent and off-intent pairs")
    order = sorted(range(len(scores)), key=lambda i: scores[i])
    ranks = [0.0] * len(scores)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and scores[order[j + 1]] == scores[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    rank_sum = sum(r for r, label in zip(ranks, labels, strict=True) if label)
    return (rank_sum - pos * (pos + 1) / 2) / (pos * neg)


def _figures(scores: list[float], labels: list[bool | None], flagged: list[bool], threshold: float | None) -> dict[str, Any]:
    """auroc, balanced accuracy of the fallback decisions, threshold, best_threshold, pairs."""
    from entroloop.streams.intent_similarity import best_threshold

    known = [(s, bool(lab), f) for s, lab, f in zip(scores, labels, flagged, strict=True) if lab is not None]
    result: dict[str, Any] = {"auroc": None, "balanced_accuracy": None, "threshold": threshold,
                              "best_threshold": None, "pairs": len(scores), "labelled": len(known)}
    pos = [k for k in known if k[1]]
    neg = [k for k in known if not k[1]]
    if pos and neg:
        s, lab = [k[0] for k in known], [k[1] for k in known]
        result["auroc"] = round(auroc(s, lab), 4)
        # on intent is predicted where no fallback was emitted
        tpr = sum(1 for k in pos if not k[2]) / len(pos)
        tnr = sum(1 for k in neg if k[2]) / len(neg)
        result["balanced_accuracy"] = round((tpr + tnr) / 2, 4)
        result["best_threshold"] = round(best_threshold(s, lab)[0], 4)
    return result


def evaluate(scorer: Any, lines: Sequence[IntentLine]) -> tuple[dict[str, Any], list[float], list[bool]]:
    """Score ``lines`` with ``scorer`` (model already loaded) and measure it: the figures `eval intent
    --json` prints (per language, ``all``, ``pairs_per_s``, ``scorer``, ``decided_by``, ``stages``),
    the scores and the fallback flags. Also used by `entroloop bench detectors` on the labelled set."""
    from entroloop.streams.intent_similarity import StageCounts, detect_language

    scorer.stages = StageCounts()
    start = time.perf_counter()
    scores = [float(s) for s in scorer.score_pairs([x.query for x in lines], [x.answer for x in lines])]
    elapsed = time.perf_counter() - start
    languages = [x.lang or detect_language(x.query) for x in lines]
    flagged = [s < scorer.threshold_for(lang) for s, lang in zip(scores, languages, strict=True)]
    by_language: dict[str, list[int]] = defaultdict(list)
    for i, lang in enumerate(languages):
        by_language[lang].append(i)
    figures: dict[str, Any] = {}
    for lang, rows in sorted(by_language.items()):
        figures[lang] = _figures([scores[i] for i in rows], [lines[i].on_intent for i in rows],
                                 [flagged[i] for i in rows], scorer.threshold_for(lang))
    # "all": the languages pooled, each pair judged at its own language's threshold
    figures["all"] = _figures(scores, [x.on_intent for x in lines], flagged, None)
    stages = scorer.stages
    figures["pairs_per_s"] = round(len(lines) / elapsed, 1) if elapsed > 0 and lines else None
    figures["scorer"] = scorer.scorer_name
    figures["decided_by"] = {
        "cheap": round(stages.cheap_decided / len(lines), 4) if lines else 0.0,
        "full": round(stages.full_pairs / len(lines), 4) if lines else 0.0,
    }
    figures["stages"] = stages.figures(len(lines))
    return figures, scores, flagged


def _cell(value: Any) -> str:
    return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)


def _rows(figures: dict[str, Any]) -> list[tuple]:
    return [(name, f["pairs"], f["labelled"], _cell(f["auroc"]), _cell(f["balanced_accuracy"]), _cell(f["threshold"]),
             _cell(f["best_threshold"])) for name, f in figures.items() if isinstance(f, dict) and "pairs" in f]


COLUMNS = ("language", "pairs", "labelled", "AUROC", "balanced accuracy", "threshold", "best threshold")


@eval_app.command("intent")
def intent(file: InputFile, as_json: AsJson = False, predictions: Predictions = None) -> None:
    """Intent scoring on labelled pairs: AUROC, balanced accuracy and thresholds per language.

    Lines: {"id", "lang", "query", "answer", "on_intent": bool}; id, lang and on_intent are optional (lang is detected from the query when absent), unknown keys ignored.

    Each pair is scored by the scorer the pipeline runs, from the same settings (ENTROLOOP_INTENT_BACKEND, _HEAD, _CASCADE, thresholds). Per language found and for "all": auroc, balanced_accuracy (of the fallback decisions at the threshold in force), threshold, best_threshold (the cut of best balanced accuracy: put it into ENTROLOOP_INTENT_LANGUAGE_THRESHOLDS), pairs; plus pairs_per_s (model loading excluded), decided_by (the share of pairs each stage decided) and stages ({"lexical"|"model": {"pairs_per_s", "decided_share"}}: each stage's pairs over its own seconds). With ENTROLOOP_INTENT_CASCADE=true every pair is also scored by the model alone, reported as "model_alone" (same keys), so the cascade's price in AUROC is on the same line. Predictions: {"id", "score", "fallback"}.
    """
    from entroloop.cli.common import settings_or_exit
    from entroloop.streams.intent_similarity import IntentSimilarityScorer

    try:
        lines = read_jsonl(file, IntentLine)
    except EvalInputError as exc:
        raise fail(str(exc)) from None
    settings = settings_or_exit()
    try:
        scorer = IntentSimilarityScorer.from_settings(settings)
        scorer.score_pairs(["warm up"], ["load the model before the clock starts"])
    except (RuntimeError, ValueError, FileNotFoundError) as exc:
        raise fail(f"cannot load the intent scorer: {exc}") from None
    figures, scores, flagged = evaluate(scorer, lines)
    write_predictions(predictions, ({"id": x.id, "score": round(s, 6), "fallback": f}
                                    for x, s, f in zip(lines, scores, flagged, strict=True)))
    if scorer.cascade:  # the same pairs through the model alone, same embedder (already loaded)
        alone = IntentSimilarityScorer.from_settings(settings.model_copy(update={"intent_cascade": False}),
                                                     embedder=scorer.embedder)
        figures["model_alone"] = evaluate(alone, lines)[0]

    print_table(
        f"Intent scoring on {file.name} ({len(lines)} pairs, {scorer.scorer_name}, "
        f"{_cell(figures['pairs_per_s'])} pairs/s)",
        COLUMNS, _rows(figures),
    )
    if "model_alone" in figures:
        alone_figures = figures["model_alone"]
        stages = figures["stages"]
        def rate(value: float | None) -> str:
            return "-" if value is None else f"{value:,.0f}" if value >= 100 else f"{value:.1f}"

        print_table(
            f"The model alone on the same pairs ({alone_figures['scorer']}, {rate(alone_figures['pairs_per_s'])} "
            f"pairs/s); the cascade's lexical stage decided {stages['lexical']['decided_share']:.1%} at "
            f"{rate(stages['lexical']['pairs_per_s'])} pairs/s, the model {stages['model']['decided_share']:.1%} at "
            f"{rate(stages['model']['pairs_per_s'])} pairs/s",
            COLUMNS, _rows(alone_figures),
        )
    if as_json:
        emit_json(figures)


def register(app: Any) -> None:
    """Nothing to add: importing this module put ``intent`` on the ``eval`` app, which eval.py registers."""


__all__ = ["IntentLine", "auroc", "evaluate", "intent", "register"]
