"""`entroloop bench detectors`: quality (precision/recall vs the fleet's labels) and speed (events/s
on one core) of every stream processor, run over the same synthetic traffic.

Speed is each processor's own ``process_batch`` over its input records, single-threaded, in
micro-batches of 512 as the runner feeds them; decoding and I/O are not included (they are the
transport's and the sinks' figures).

Intent similarity is measured by entroloop/benchmarks/intent.py: the configured scorer and the
two-stage cascade, pairs/s per stage and the share each stage decided.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from collectors.synthetic_fleet import SyntheticFleet
from entroloop.benchmarks import intent as intent_bench
from entroloop.benchmarks.report import Figure
from entroloop.contract.records import (
    Alert,
    Audit,
    BadCase,
    Event,
    Fallback,
    Feedback,
    IntentScore,
)
from entroloop.contract.settings import Settings
from streams.base import Processor
from streams.defaults import default_processors, intent_scoring_available
from streams.intent_similarity import IntentSimilarityScorer

BATCH = 512


def _rate(processor: Processor, records: Sequence[Event]) -> tuple[float, list[Event]]:
    out: list[Event] = []
    start = time.perf_counter()
    for i in range(0, len(records), BATCH):
        out.extend(processor.process_batch(records[i : i + BATCH]))
    out.extend(processor.on_watermark(float("inf")))
    elapsed = time.perf_counter() - start
    return len(records) / elapsed if elapsed else float("inf"), out


def _pr(predicted: set, actual: set) -> tuple[float | None, float | None]:
    tp = len(predicted & actual)
    precision = tp / len(predicted) if predicted else (1.0 if not actual else 0.0)
    recall = tp / len(actual) if actual else None
    return round(precision, 4), None if recall is None else round(recall, 4)


def run(requests: int = 3000, seed: int = 11, with_intent: bool | None = None, progress: Callable[[str], None] = lambda _: None) -> dict[str, dict[str, Any]]:
    """Precision, recall and events/s per processor: ``{name: {precision, recall, events_per_s}}``."""
    fleet = SyntheticFleet(seed=seed)
    reqs = list(fleet.requests(requests))
    labels = {q.labels.request_id: q.labels for q in reqs}
    records = [r for q in reqs for r in q.records]
    settings = Settings()
    results: dict[str, dict[str, Any]] = {}
    for processor in default_processors(settings, with_intent=with_intent):
        progress(processor.name)
        inputs = [r for r in records if isinstance(r, processor.inputs)]
        if processor.name == "retrain_triggers":  # it consumes bad cases: feed the joiner's output
            joiner = next(p for p in default_processors(settings, with_intent=False) if p.name == "bad_cases")
            inputs = sorted(
                [r for r in records if isinstance(r, Audit)] + joiner.process_batch([r for r in records if isinstance(r, (Audit, Feedback))]),
                key=lambda r: r.emitted_at,
            )
        if isinstance(processor, IntentSimilarityScorer):
            results.update(intent_bench.measure(processor, inputs, labels, settings))
            continue
        rate, out = _rate(processor, inputs)
        if processor.name == "response_rules":  # its per-response verdicts, not its window counts
            out = [r for r in inputs if any(v.rule == "amount_format" for v in processor.rules.check_response(r.response))]
        results.update(_quality(processor.name, out, labels, rate))
    return results


def _quality(name: str, out: list[Event], labels: dict, rate: float) -> dict[str, dict[str, Any]]:
    alerts = [o for o in out if isinstance(o, Alert)]
    if name == "entropy_anomaly":
        res = {}
        for rule, attr in (("repetition_loop", "loops"), ("gibberish", "gibberish")):
            predicted = {(a.request_id, a.token_start) for a in alerts if a.rule == rule}
            truth = {(rid, s) for rid, lab in labels.items() for s, _ in getattr(lab, attr)}
            # an alert is right when it overlaps an injected run of its kind in the same request
            hits = {
                (a.request_id, a.token_start)
                for a in alerts
                if a.rule == rule
                and any(a.token_start < e and s < a.token_end for s, e in getattr(labels[a.request_id], attr))
            }
            found = {
                (rid, s) for rid, lab in labels.items() for s, e in getattr(lab, attr)
                if any(a.request_id == rid and a.rule == rule and a.token_start < e and s < a.token_end for a in alerts)
            }
            res[rule] = {
                "precision": round(len(hits) / len(predicted), 4) if predicted else 1.0,
                "recall": round(len(found) / len(truth), 4) if truth else None,
                "events_per_s": round(rate),
            }
        return res
    if name == "entropy_baseline":
        predicted = {a.request_id for a in alerts}
        actual = {rid for rid, lab in labels.items() if lab.loops or lab.gibberish}
        p, r = _pr(predicted, actual)
        return {name: {"precision": p, "recall": r, "events_per_s": round(rate), "note": "vs requests with an injected loop or gibberish run"}}
    if name == "bad_cases":
        cases = [o for o in out if isinstance(o, BadCase)]
        right = {c.request_id for c in cases if labels[c.request_id].error_label in c.labels}
        actual = {rid for rid, lab in labels.items() if lab.corrected}
        return {name: {
            "precision": round(len(right) / len(cases), 4) if cases else 1.0,
            "recall": round(len(right & actual) / len(actual), 4) if actual else None,
            "events_per_s": round(rate),
            "note": "a bad case counts when it carries the injected error's label",
        }}
    if name == "response_rules":
        predicted = {o.request_id for o in out}
        actual = {rid for rid, lab in labels.items() if lab.format_error and lab.error_label == "amount_format"}
        p, r = _pr(predicted, actual)
        return {name: {"precision": p, "recall": r, "events_per_s": round(rate), "note": "currency format in every response (no correction needed)"}}
    if name == "intent_similarity":
        predicted = {o.request_id for o in out if isinstance(o, Fallback)}
        actual = {rid for rid, lab in labels.items() if lab.off_intent}
        p, r = _pr(predicted, actual)
        scores = [o for o in out if isinstance(o, IntentScore)]
        return {name: {"precision": p, "recall": r, "events_per_s": round(rate), "scored": len(scores)}}
    return {name: {"precision": None, "recall": None, "events_per_s": round(rate)}}


TARGETS = {
    "repetition_loop": 20_000, "gibberish": 20_000, "fallback_rates": 20_000, "intent_similarity": 500,
}


def figures(results: dict[str, dict[str, Any]]) -> list[Figure]:
    figs = []
    for name, res in results.items():
        target = TARGETS.get(name)
        figs.append(Figure(
            "detectors", f"{name} events/s (1 core)", res["events_per_s"], "events/s",
            target=f">= {target:,}" if target else "", met=(res["events_per_s"] >= target) if target else None,
            baseline=res.get("baseline", ""), note=res.get("note", ""),
        ))
        if res.get("recall") is not None:
            quality_target = name in ("repetition_loop", "gibberish")
            figs.append(Figure(
                "detectors", f"{name} precision / recall", res["precision"], "precision",
                target="P >= 0.90, R >= 0.95" if quality_target else "",
                met=(res["precision"] >= 0.90 and res["recall"] >= 0.95) if quality_target else None,
                note=f"recall {res['recall']}",
            ))
    return figs


__all__ = ["figures", "intent_scoring_available", "run"]
