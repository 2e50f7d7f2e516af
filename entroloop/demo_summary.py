"""The demo's verdict: what the fleet emitted and injected vs what the pipeline stored and found.

Used by the embedded demo and by the demo through Kafka, so both answer the same questions from
the same place (ClickHouse and the audit store), whichever transport carried the events.
"""

from __future__ import annotations

import io
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pyarrow.parquet as pq

from entroloop.collectors.synthetic_fleet import FleetRequest
from entroloop.contract.records import DeadLetter
from entroloop.contract.topics import TOPICS
from entroloop.infra.worm.worm_store import WormStore


@dataclass
class FleetTruth:
    """Ground truth accumulated while the fleet runs."""

    requests: int = 0
    emitted: Counter = field(default_factory=Counter)
    anomalies: dict[str, list[tuple[str, int, int]]] = field(default_factory=dict)
    corrections: dict[str, str] = field(default_factory=dict)
    fallbacks: int = 0
    malformed: int = 0

    def observe(self, request: FleetRequest) -> None:
        lab = request.labels
        self.requests += 1
        for record in request.records:
            self.emitted[record.topic] += 1
        runs = [("repetition_loop", *s) for s in lab.loops] + [("gibberish", *s) for s in lab.gibberish]
        if runs:
            self.anomalies[lab.request_id] = runs
        if lab.corrected:
            self.corrections[lab.request_id] = lab.error_label
        self.fallbacks += lab.fallback


def score_anomalies(alerts: list[tuple[str, str, int, int]], truth: dict[str, list[tuple[str, int, int]]]) -> dict[str, Any]:
    """Match alerts to injected runs (same request and rule, overlapping spans)."""
    injected = sum(len(v) for v in truth.values())
    matched: set[tuple[str, int]] = set()
    true_positive = 0
    for rule, request_id, start, end in alerts:
        hit = False
        for i, (t_rule, t_start, t_end) in enumerate(truth.get(request_id, [])):
            if t_rule == rule and start < t_end and t_start < end:
                matched.add((request_id, i))
                hit = True
        true_positive += hit
    found = len(alerts)
    return {
        "found": found,
        "injected": injected,
        "matched": len(matched),
        "precision": round(true_positive / found, 4) if found else 1.0,
        "recall": round(len(matched) / injected, 4) if injected else 1.0,
    }


def summarize(client: Any, database: str, truth: FleetTruth, emitted: dict[str, int], store: WormStore) -> dict[str, Any]:
    """Everything the demo reports, read back from storage (``FINAL``: distinct events)."""

    def rows(sql: str) -> list[tuple]:
        return client.query(sql).result_rows

    def count(table: str) -> int:
        return int(rows(f"SELECT count() FROM {database}.{table} FINAL")[0][0])

    table_rows = {t.table: count(t.table) for t in TOPICS}
    stored = {t.name: table_rows[t.table] for t in TOPICS}
    emitted = {t.name: emitted.get(t.name, 0) for t in TOPICS}
    alerts = rows(
        f"SELECT rule, request_id, token_start, token_end FROM {database}.alerts FINAL "
        "WHERE rule IN ('repetition_loop', 'gibberish')"
    )
    reasons = dict(rows(f"SELECT error_type, count() FROM {database}.dead_letters FINAL GROUP BY error_type"))
    audit_files = [k for k in store.list("audit/") if k.endswith(".parquet")]
    audit_records = sum(pq.read_metadata(io.BytesIO(store.get(k))).num_rows for k in audit_files)
    labels = {rid: set(ls) for rid, ls in rows(f"SELECT request_id, labels FROM {database}.bad_cases FINAL")}
    gateway_fallbacks = rows(f"SELECT count() FROM {database}.fallbacks FINAL WHERE source = 'gateway'")[0][0]
    # intent scores and the share below their language's threshold (an intent fallback), per language and route
    intent = [
        {"language": language, "route": route, "pairs": int(n), "mean_score": round(float(mean), 4),
         "fallback_rate": round(int(below) / int(n), 4)}
        for language, route, n, mean, below in rows(
            f"SELECT language, route, count(), avg(similarity), countIf(similarity < threshold) "
            f"FROM {database}.intent_scores FINAL GROUP BY language, route ORDER BY language, route")
    ]
    return {
        "events_emitted": emitted,
        "stored": stored,
        "lost": {t: emitted[t] - stored[t] for t in emitted if emitted[t] != stored[t]},
        "rows": table_rows,
        "dead_letters": stored[DeadLetter.topic],
        "dead_letter_reasons": reasons,
        "malformed_injected": truth.malformed,
        "audit_files": len(audit_files),
        "audit_records": audit_records,
        "anomalies": score_anomalies([tuple(a) for a in alerts], truth.anomalies),
        "bad_cases": {
            "corrections_injected": len(truth.corrections),
            "found": sum(1 for rid in truth.corrections if rid in labels),
            "right_label": sum(1 for rid, label in truth.corrections.items() if label in labels.get(rid, ())),
            "wrong_label": sorted({lab for rid, lab in truth.corrections.items() if lab not in labels.get(rid, ())}),
        },
        "fallback_rate": {
            "injected": round(truth.fallbacks / max(truth.requests, 1), 4),
            "stored": round(gateway_fallbacks / max(table_rows["audit_index"], 1), 4),
        },
        "intent": intent,
    }
