"""What the operator's report shows, read from ClickHouse (embedded chDB or a server) in one pass.

The bucket width adapts to the stored range (about 30 buckets), so a 40-second demo and a day of
production both give readable curves. Raw tables are read with FINAL so a redelivered event is
counted once, like the sinks guarantee.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

BUCKET_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400)
ALERT_RULES = ("repetition_loop", "gibberish", "entropy_baseline_shift")

Points = list[tuple[float, float]]


@dataclass
class ReportData:
    database: str
    start: float | None = None
    end: float | None = None
    bucket_s: int = 60
    table_rows: dict[str, int] = field(default_factory=dict)
    entropy: dict[str, Points] = field(default_factory=dict)  # model -> mean entropy per bucket
    anomaly_rates: dict[str, Points] = field(default_factory=dict)  # rule -> alerts per request
    fallback_rates: dict[str, Points] = field(default_factory=dict)  # route -> fallbacks per request
    ttft: dict[str, Points] = field(default_factory=dict)  # p50/p95/p99 -> seconds per bucket
    latency_by_model: dict[str, dict[str, float]] = field(default_factory=dict)  # model -> {e2e p50..}
    funnel: list[tuple[str, float]] = field(default_factory=list)
    worst_requests: list[dict[str, Any]] = field(default_factory=list)
    dead_letters: list[dict[str, Any]] = field(default_factory=list)
    actions: list[dict[str, Any]] = field(default_factory=list)
    intent: list[dict[str, Any]] = field(default_factory=list)  # per language and route: scores, fallbacks


def choose_bucket(span_s: float, buckets: int = 30) -> int:
    """The smallest round bucket width giving at most ``buckets`` buckets over ``span_s``."""
    return next((s for s in BUCKET_STEPS_S if span_s / s <= buckets), BUCKET_STEPS_S[-1])


class _Reader:
    def __init__(self, client: Any, database: str) -> None:
        self.client = client
        self.db = database

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self.client.query(sql.replace("{db}", self.db)).result_rows]

    def dicts(self, sql: str) -> list[dict[str, Any]]:
        result = self.client.query(sql.replace("{db}", self.db))
        return [dict(zip(result.column_names, r)) for r in result.result_rows]


def _series(rows: list[tuple[Any, ...]]) -> dict[str, Points]:
    """(t, name, value) rows -> name -> [(t, value)]."""
    out: dict[str, Points] = defaultdict(list)
    for t, name, value in rows:
        if value is not None:
            out[str(name)].append((float(t), float(value)))
    return dict(out)


def load_report_data(client: Any, database: str = "entroloop") -> ReportData:
    r = _Reader(client, database)
    data = ReportData(database)
    for table in ("token_entropy", "spans", "audit_index", "feedback", "fallbacks", "intent_scores", "bad_cases",
                  "alerts", "actions", "retrain_requests", "health", "dead_letters"):
        data.table_rows[table] = int(r.rows(f"SELECT count() FROM {{db}}.{table} FINAL")[0][0])
    lo, hi, n = r.rows("SELECT toFloat64(min(emitted_at)), toFloat64(max(emitted_at)), count() FROM {db}.token_entropy")[0]
    if not n:
        return data
    data.start, data.end = float(lo), float(hi)
    data.bucket_s = b = choose_bucket(data.end - data.start)
    bucket = f"toFloat64(toUnixTimestamp(toStartOfInterval(emitted_at, INTERVAL {b} SECOND)))"

    data.entropy = _series(r.rows(f"""
        SELECT {bucket} AS t, model, sum(arraySum(entropies)) / sum(length(entropies))
        FROM {{db}}.token_entropy FINAL WHERE length(entropies) > 0 GROUP BY t, model ORDER BY t"""))

    requests = f"SELECT {bucket} AS t, count() AS n FROM {{db}}.audit_index FINAL GROUP BY t"
    rules = ", ".join(f"'{rule}'" for rule in ALERT_RULES)
    data.anomaly_rates = _series(r.rows(f"""
        SELECT req.t, rule_name, if(req.n = 0, 0, coalesce(a.n, 0) / req.n)
        FROM ({requests}) AS req
        CROSS JOIN (SELECT arrayJoin([{rules}]) AS rule_name) AS rs
        LEFT JOIN (SELECT {bucket} AS t, rule, count() AS n FROM {{db}}.alerts FINAL WHERE rule IN ({rules}) GROUP BY t, rule) AS a
            ON a.t = req.t AND a.rule = rs.rule_name
        ORDER BY req.t"""))
    # intent fallback rate = scores below the threshold applied to their language (IntentScore.threshold)
    data.intent = r.dicts("""
        SELECT language, route, any(embedder) AS scorer, count() AS pairs, round(avg(similarity), 3) AS mean_score,
               round(quantile(0.1)(similarity), 3) AS p10_score, round(any(threshold), 3) AS fallback_threshold,
               round(countIf(similarity < threshold) / count(), 4) AS fallback_rate
        FROM {db}.intent_scores FINAL GROUP BY language, route ORDER BY language, route""")
    data.fallback_rates = _series(r.rows(f"""
        SELECT req.t, req.route, coalesce(f.n, 0) / req.n
        FROM (SELECT {bucket} AS t, route, count() AS n FROM {{db}}.audit_index FINAL GROUP BY t, route) AS req
        LEFT JOIN (SELECT {bucket} AS t, route, count() AS n FROM {{db}}.fallbacks FINAL GROUP BY t, route) AS f
            ON f.t = req.t AND f.route = req.route
        ORDER BY req.t"""))

    for t, q in r.rows(f"""
        SELECT {bucket} AS t, quantiles(0.5, 0.95, 0.99)(ttft_s) FROM {{db}}.spans FINAL
        WHERE name = 'llm_request' AND ttft_s IS NOT NULL GROUP BY t ORDER BY t"""):
        for level, value in zip(("p50", "p95", "p99"), q):
            data.ttft.setdefault(level, []).append((float(t), float(value)))
    for model, q in r.rows("""
        SELECT model, quantiles(0.5, 0.95, 0.99)(e2e_s) FROM {db}.spans FINAL
        WHERE name = 'llm_request' AND e2e_s IS NOT NULL GROUP BY model ORDER BY model"""):
        data.latency_by_model[str(model)] = {f"e2e {lvl}": float(v) for lvl, v in zip(("p50", "p95", "p99"), q)}

    ((feedback, negative, corrections),) = r.rows(
        "SELECT count(), countIf(rating < 0), countIf(has_correction) FROM {db}.feedback FINAL")
    ((trained,),) = r.rows("SELECT count() FROM {db}.adapters FINAL")
    ((promoted, rolled_back),) = r.rows(
        "SELECT uniqExactIf(adapter_id, status = 'promoted'), uniqExactIf(adapter_id, status = 'rolled_back') FROM {db}.adapter_status")
    data.funnel = [
        ("feedback", feedback), ("negative feedback", negative), ("corrections", corrections),
        ("bad cases", data.table_rows["bad_cases"]), ("retrain requests", data.table_rows["retrain_requests"]),
        ("adapters trained", trained), ("adapters promoted", promoted), ("adapters rolled back", rolled_back),
    ]
    data.funnel = [(label, float(v)) for label, v in data.funnel]

    data.worst_requests = r.dicts(f"""
        SELECT te.request_id AS request_id, te.model AS model, te.route AS route, te.node_id AS node,
               te.tokens AS tokens, round(te.mean_e, 3) AS mean_entropy, a.rules AS alerts
        FROM (
            SELECT request_id, model, route, node_id, sum(length(entropies)) AS tokens,
                   sum(arraySum(entropies)) / greatest(tokens, 1) AS mean_e
            FROM {{db}}.token_entropy FINAL GROUP BY request_id, model, route, node_id
            ORDER BY mean_e DESC LIMIT 10
        ) AS te
        LEFT JOIN (
            SELECT request_id, arrayStringConcat(groupUniqArray(rule), ', ') AS rules
            FROM {{db}}.alerts FINAL WHERE rule IN ({rules}) GROUP BY request_id
        ) AS a ON te.request_id = a.request_id
        ORDER BY mean_entropy DESC""")
    data.dead_letters = r.dicts("""
        SELECT source_topic, error_type, count() AS dead_letters FROM {db}.dead_letters FINAL
        GROUP BY source_topic, error_type ORDER BY dead_letters DESC""")
    data.actions = r.dicts("""
        SELECT runbook, action, outcome, dry_run, count() AS actions FROM {db}.actions FINAL
        GROUP BY runbook, action, outcome, dry_run ORDER BY runbook, action, outcome""")
    return data


__all__ = ["ReportData", "choose_bucket", "load_report_data"]
