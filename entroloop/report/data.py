"""What the operator's report shows, read from ClickHouse (embedded chDB or a server) in one pass.

Every query keeps only the rows inside the report's window (``ReportWindow``: ``--since`` /
``--until`` on ``emitted_at``, or on ``registered_at`` / ``at`` for the adapter registry). The
bucket width adapts to the range of what is stored in the window (about 30 buckets), so a
40-second demo and a day of production both give readable curves. Raw tables are read with FINAL
so a redelivered event is counted once, like the sinks guarantee.
"""

from __future__ import annotations

import json
import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from entroloop.contract.records import NEGATIVE_RATING
from entroloop.report.feedback_funnel import feedback_funnel_sql
from entroloop.report.window import ReportWindow

BUCKET_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400)
ALERT_RULES = ("repetition_loop", "gibberish", "entropy_baseline_shift")
HISTOGRAM_BIN_STEPS = (0.05, 0.1, 0.2, 0.25, 0.5, 1.0)  # nats
# The serving engine's own request span (vLLM): the only one with queue / prefill / decode timings.
ENGINE_SPAN = "llm_request"
LATENCY_STAGES = ("queue", "prefill", "decode", "ttft", "tpot", "e2e")
BAD_CASES_SHOWN = 12
ALERTS_SHOWN = 20
REQUESTS_SHOWN = 20
ADAPTERS_SHOWN = 50

Points = list[tuple[float, float]]


@dataclass
class BadCaseRow:
    """One bad case as the page shows it: both texts, the diff and the minimal failing example."""

    emitted_at: float
    request_id: str
    model: str
    route: str
    adapter: str
    labels: list[str]
    confidence: float
    prompt: str
    response: str
    correction: str
    diff: list[tuple[str, str, str]]  # (op, text in the response, text in the correction)
    minimal_span: tuple[int, int]  # character offsets into the response

    @property
    def minimal_example(self) -> tuple[str, str]:
        """(what the response says, what the correction says instead) over the minimal span.

        The joiner guarantees ``response[:start] + replacement + response[end:] == correction``, so
        the replacement is the correction minus the response's untouched prefix and suffix."""
        start, end = self.minimal_span
        start, end = max(0, min(start, len(self.response))), max(0, min(end, len(self.response)))
        replacement = self.correction[start : max(start, len(self.correction) - (len(self.response) - end))]
        return self.response[start:end], replacement


@dataclass
class ReportData:
    database: str
    window: ReportWindow = field(default_factory=ReportWindow)
    start: float | None = None  # first and last stored event inside the window
    end: float | None = None
    bucket_s: int = 60
    table_rows: dict[str, int] = field(default_factory=dict)
    entropy: dict[str, Points] = field(default_factory=dict)  # model -> mean entropy per bucket
    # model -> [(bin low edge, requests)] of per-request mean entropy, bins ``histogram_bin`` nats wide
    entropy_histogram: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    histogram_bin: float = 0.1
    anomaly_rates: dict[str, Points] = field(default_factory=dict)  # rule -> alerts per request
    fallback_rates: dict[str, Points] = field(default_factory=dict)  # route -> fallbacks per request
    ttft: dict[str, Points] = field(default_factory=dict)  # p50/p95/p99 -> seconds per bucket
    tpot: dict[str, Points] = field(default_factory=dict)  # p50/p95 -> seconds per output token per bucket
    latency_by_model: dict[str, dict[str, float]] = field(default_factory=dict)  # model -> {e2e p50..}
    # one row per model (and "all models"): request count and p50/p95 of each stage, seconds (None: not reported)
    latency_stages: list[dict[str, Any]] = field(default_factory=list)
    funnel: list[tuple[str, float]] = field(default_factory=list)
    # feedback on an answer served to another tenant: left out of the funnel, as the bad-case join refuses it
    other_tenant_feedback: int = 0
    negative_rating: int = NEGATIVE_RATING
    worst_requests: list[dict[str, Any]] = field(default_factory=list)
    latest_requests: list[dict[str, Any]] = field(default_factory=list)  # the latest REQUESTS_SHOWN audited
    alerts: list[dict[str, Any]] = field(default_factory=list)  # the latest ALERTS_SHOWN
    bad_cases: list[BadCaseRow] = field(default_factory=list)  # the latest BAD_CASES_SHOWN
    adapters: list[dict[str, Any]] = field(default_factory=list)
    dead_letters: list[dict[str, Any]] = field(default_factory=list)
    actions: list[dict[str, Any]] = field(default_factory=list)
    intent: list[dict[str, Any]] = field(default_factory=list)  # per language and route: scores, fallbacks


def choose_bucket(span_s: float, buckets: int = 30) -> int:
    """The smallest round bucket width giving at most ``buckets`` buckets over ``span_s``."""
    return next((s for s in BUCKET_STEPS_S if span_s / s <= buckets), BUCKET_STEPS_S[-1])


def choose_bin(lo: float, hi: float, bins: int = 40) -> float:
    """The smallest round histogram bin width (nats) giving at most ``bins`` bins over [lo, hi]."""
    return next((w for w in HISTOGRAM_BIN_STEPS if (hi - lo) / w <= bins), HISTOGRAM_BIN_STEPS[-1])


class _Reader:
    """Runs the report's SQL: ``{db}`` is the database, ``{in_window}`` the window on ``emitted_at``."""

    def __init__(self, client: Any, database: str, window: ReportWindow) -> None:
        self.client = client
        self.db = database
        self.window = window

    def _sql(self, sql: str) -> str:
        return sql.replace("{db}", self.db).replace("{in_window}", self.window.sql("emitted_at"))

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self.client.query(self._sql(sql)).result_rows]

    def dicts(self, sql: str) -> list[dict[str, Any]]:
        result = self.client.query(self._sql(sql))
        return [dict(zip(result.column_names, r)) for r in result.result_rows]


def _series(rows: list[tuple[Any, ...]]) -> dict[str, Points]:
    """(t, name, value) rows -> name -> [(t, value)], names sorted so a model keeps its colour in every chart."""
    out: dict[str, Points] = defaultdict(list)
    for t, name, value in rows:
        if value is not None and math.isfinite(value):
            out[str(name)].append((float(t), float(value)))
    return dict(sorted(out.items()))


def _finite(value: Any) -> float | None:
    """A quantile as a float, or None where ClickHouse had nothing to rank (NULL or nan)."""
    return float(value) if value is not None and math.isfinite(value) else None


EVENT_TABLES = ("token_entropy", "spans", "audit_index", "feedback", "fallbacks", "intent_scores", "bad_cases",
                "alerts", "actions", "retrain_requests", "health", "dead_letters")


def load_report_data(client: Any, database: str = "entroloop", window: ReportWindow | None = None,
                     negative_rating: int = NEGATIVE_RATING) -> ReportData:
    """Everything the page shows, for events inside ``window`` (default: all stored events).

    ``negative_rating``: feedback rated at or below it counts as negative in the funnel; the default
    (below zero) is the Grafana funnel's definition, so both views count the same feedback."""
    window = window or ReportWindow()
    r = _Reader(client, database, window)
    data = ReportData(database, window, negative_rating=negative_rating)
    for table in EVENT_TABLES:
        data.table_rows[table] = int(r.rows(f"SELECT count() FROM {{db}}.{table} FINAL WHERE {{in_window}}")[0][0])
    _load_funnel(r, data)
    _load_adapters(r, data)
    data.table_rows["adapters"] = len(data.adapters)
    _load_tables(r, data)

    # The time axis: what the serving nodes stored in the window (any of the three request tables).
    lo, hi, n = r.rows("""
        SELECT min(t0), max(t1), sum(n) FROM (
            SELECT toFloat64(min(emitted_at)) AS t0, toFloat64(max(emitted_at)) AS t1, count() AS n
                FROM {db}.token_entropy WHERE {in_window}
            UNION ALL SELECT toFloat64(min(emitted_at)), toFloat64(max(emitted_at)), count()
                FROM {db}.spans WHERE {in_window}
            UNION ALL SELECT toFloat64(min(emitted_at)), toFloat64(max(emitted_at)), count()
                FROM {db}.audit_index WHERE {in_window}
        ) WHERE n > 0""")[0]
    if not n:
        return data
    data.start, data.end = float(lo), float(hi)
    data.bucket_s = choose_bucket(data.end - data.start)
    _load_entropy(r, data)
    _load_rates(r, data)
    _load_latency(r, data)
    return data


def _bucket(data: ReportData) -> str:
    return f"toFloat64(toUnixTimestamp(toStartOfInterval(emitted_at, INTERVAL {data.bucket_s} SECOND)))"


def _load_entropy(r: _Reader, data: ReportData) -> None:
    bucket = _bucket(data)
    data.entropy = _series(r.rows(f"""
        SELECT {bucket} AS t, model, sum(arraySum(entropies)) / sum(length(entropies))
        FROM {{db}}.token_entropy FINAL WHERE {{in_window}} AND length(entropies) > 0 GROUP BY t, model ORDER BY t"""))
    # A request's mean is token-weighted over all its chunks, like the detectors see the request.
    per_request = """
        SELECT model, sum(arraySum(entropies)) / sum(length(entropies)) AS mean_e
        FROM {db}.token_entropy FINAL WHERE {in_window} AND length(entropies) > 0 GROUP BY request_id, model"""
    lo, hi, n = r.rows(f"SELECT min(mean_e), max(mean_e), count() FROM ({per_request})")[0]
    if not n:
        return
    data.histogram_bin = width = choose_bin(float(lo), float(hi))
    histogram: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for model, k, count in r.rows(f"""
        SELECT model, toInt64(floor(mean_e / {width})) AS k, count() FROM ({per_request})
        GROUP BY model, k ORDER BY model, k"""):
        histogram[str(model)].append((round(int(k) * width, 6), int(count)))
    data.entropy_histogram = dict(histogram)


def _load_rates(r: _Reader, data: ReportData) -> None:
    bucket = _bucket(data)
    # a request is its audit's first part (a large audit is published in parts, migration 0008)
    requests = f"SELECT {bucket} AS t, count() AS n FROM {{db}}.audit_index FINAL WHERE {{in_window}} AND part_index = 0 GROUP BY t"
    rules = ", ".join(f"'{rule}'" for rule in ALERT_RULES)
    data.anomaly_rates = _series(r.rows(f"""
        SELECT req.t, rule_name, if(req.n = 0, 0, coalesce(a.n, 0) / req.n)
        FROM ({requests}) AS req
        CROSS JOIN (SELECT arrayJoin([{rules}]) AS rule_name) AS rs
        LEFT JOIN (SELECT {bucket} AS t, rule, count() AS n FROM {{db}}.alerts FINAL
                   WHERE {{in_window}} AND rule IN ({rules}) GROUP BY t, rule) AS a
            ON a.t = req.t AND a.rule = rs.rule_name
        ORDER BY req.t"""))
    data.fallback_rates = _series(r.rows(f"""
        SELECT req.t, req.route, coalesce(f.n, 0) / req.n
        FROM (SELECT {bucket} AS t, route, count() AS n FROM {{db}}.audit_index FINAL WHERE {{in_window}} AND part_index = 0 GROUP BY t, route) AS req
        LEFT JOIN (SELECT {bucket} AS t, route, count() AS n FROM {{db}}.fallbacks FINAL WHERE {{in_window}} GROUP BY t, route) AS f
            ON f.t = req.t AND f.route = req.route
        ORDER BY req.t"""))


def _load_latency(r: _Reader, data: ReportData) -> None:
    bucket = _bucket(data)
    engine = f"{{db}}.spans FINAL WHERE {{in_window}} AND name = '{ENGINE_SPAN}'"
    for t, q in r.rows(f"""
        SELECT {bucket} AS t, quantiles(0.5, 0.95, 0.99)(ttft_s) FROM {engine}
        AND ttft_s IS NOT NULL GROUP BY t ORDER BY t"""):
        for level, value in zip(("p50", "p95", "p99"), q):
            if _finite(value) is not None:
                data.ttft.setdefault(level, []).append((float(t), float(value)))
    for t, q in r.rows(f"""
        SELECT {bucket} AS t, quantiles(0.5, 0.95)(tpot_s) FROM {engine}
        AND tpot_s IS NOT NULL GROUP BY t ORDER BY t"""):
        for level, value in zip(("p50", "p95"), q):
            if _finite(value) is not None:
                data.tpot.setdefault(level, []).append((float(t), float(value)))
    for model, q in r.rows(f"""
        SELECT model, quantiles(0.5, 0.95, 0.99)(e2e_s) FROM {engine}
        AND e2e_s IS NOT NULL GROUP BY model ORDER BY model"""):
        data.latency_by_model[str(model)] = {f"e2e {lvl}": float(v) for lvl, v in zip(("p50", "p95", "p99"), q)}
    stages = ", ".join(f"quantiles(0.5, 0.95)({s}_s)" for s in LATENCY_STAGES)
    rows = r.rows(f"""
        SELECT model, count(), {stages} FROM {engine} GROUP BY model
        UNION ALL SELECT 'all models', count(), {stages} FROM {engine}""")
    for model, requests, *quantiles in sorted(rows, key=lambda row: (row[0] == "all models", row[0])):
        if not requests:
            continue
        row: dict[str, Any] = {"model": str(model), "requests": int(requests)}
        for stage, (p50, p95) in zip(LATENCY_STAGES, quantiles):
            row[f"{stage} p50"], row[f"{stage} p95"] = _finite(p50), _finite(p95)
        data.latency_stages.append(row)
    if len(data.latency_stages) == 2:  # one model: its row and "all models" say the same
        data.latency_stages = data.latency_stages[:1]


def _load_funnel(r: _Reader, data: ReportData) -> None:
    # Counted as the Grafana funnel counts them: only verdicts on the answer's own tenant's answers.
    ((feedback, negative, corrections, other_tenant),) = r.rows(
        feedback_funnel_sql("{db}", "{in_window}", data.negative_rating))
    data.other_tenant_feedback = int(other_tenant)
    registered = data.window.sql("registered_at")
    changed = data.window.sql("at")
    ((trained,),) = r.rows(f"SELECT count() FROM {{db}}.adapters FINAL WHERE {registered}")
    ((promoted, rolled_back),) = r.rows(f"""
        SELECT uniqExactIf(adapter_id, status = 'promoted'), uniqExactIf(adapter_id, status = 'rolled_back')
        FROM {{db}}.adapter_status WHERE {changed}""")
    funnel = [
        ("feedback", feedback), ("negative feedback", negative),
        ("corrections", corrections), ("bad cases", data.table_rows["bad_cases"]),
        ("retrain requests", data.table_rows["retrain_requests"]), ("adapters trained", trained),
        ("adapters promoted", promoted), ("adapters rolled back", rolled_back),
    ]
    data.funnel = [(label, float(v)) for label, v in funnel]


def _load_adapters(r: _Reader, data: ReportData) -> None:
    """Adapters registered or changing state in the window, each with its state as of the window's end.

    ``version`` is the adapter's rank among its model's registrations (v1 = the first trained),
    counted over the whole registry so a narrow window does not renumber them."""
    until = ReportWindow(None, data.window.until).sql("at")  # the state as of the window's end
    for row in r.dicts(f"""
        SELECT a.adapter_id AS adapter, a.model AS model, a.version AS version, a.parent_adapter AS parent,
               toFloat64(a.registered_at) AS registered, s.current_status AS status, toFloat64(s.changed_at) AS changed,
               toFloat64(s.promoted_at) AS promoted, toFloat64(s.rolled_back_at) AS rolled_back, a.metrics AS metrics
        FROM (
            SELECT adapter_id, model, parent_adapter, registered_at, metrics,
                   row_number() OVER (PARTITION BY model ORDER BY registered_at, adapter_id) AS version
            FROM {{db}}.adapters FINAL
        ) AS a
        LEFT JOIN (
            SELECT adapter_id, argMax(status, at) AS current_status, max(at) AS changed_at,
                   minIf(at, status = 'promoted') AS promoted_at, countIf(status = 'promoted') AS promotions,
                   minIf(at, status = 'rolled_back') AS rolled_back_at, countIf(status = 'rolled_back') AS rollbacks,
                   countIf({data.window.sql("at")}) AS changes_in_window
            FROM {{db}}.adapter_status WHERE {until} GROUP BY adapter_id
        ) AS s ON s.adapter_id = a.adapter_id
        WHERE {data.window.sql("a.registered_at")} OR s.changes_in_window > 0
        ORDER BY greatest(a.registered_at, s.changed_at) DESC LIMIT {ADAPTERS_SHOWN}"""):
        has_status = bool(row["status"])
        data.adapters.append({
            "adapter": row["adapter"],
            "model": row["model"],
            "version": f"v{row['version']}",
            "parent": row["parent"] or "base model",
            "status": row["status"] if has_status else "registered",
            "registered": row["registered"],
            "status since": row["changed"] if has_status else row["registered"],
            "promoted": row["promoted"] if has_status and row["promoted"] > 0 else None,
            "rolled back": row["rolled_back"] if has_status and row["rolled_back"] > 0 else None,
            "metrics": key_metrics(row["metrics"]),
        })


# Shown first when an adapter's metrics hold them (training/pipeline.py writes gate, train, dataset).
KEY_METRICS = ("gate.adapter_pass_rate", "gate.parent_pass_rate", "gate.adapter_loss", "gate.parent_loss",
               "dataset.corrections", "train.steps")


def key_metrics(metrics_json: str, limit: int = 6) -> dict[str, Any]:
    """The registry's metrics JSON flattened to ``a.b`` keys, the known key figures first, at most ``limit``."""
    try:
        metrics = json.loads(metrics_json or "{}")
    except ValueError:
        return {"metrics": "(unreadable JSON)"}
    flat: dict[str, Any] = {}

    def walk(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v)
        elif isinstance(value, (int, float, str, bool)) or value is None:
            flat[prefix] = value

    walk("", metrics)
    ordered = [k for k in KEY_METRICS if k in flat] + [k for k in flat if k not in KEY_METRICS]
    return {k: flat[k] for k in ordered[:limit]}


def _load_tables(r: _Reader, data: ReportData) -> None:
    rules = ", ".join(f"'{rule}'" for rule in ALERT_RULES)
    # intent fallback rate = scores below the threshold applied to their language (IntentScore.threshold)
    data.intent = r.dicts("""
        SELECT language, route, any(embedder) AS scorer, count() AS pairs, round(avg(similarity), 3) AS mean_score,
               round(quantile(0.1)(similarity), 3) AS p10_score, round(toFloat64(any(threshold)), 3) AS fallback_threshold,
               round(countIf(similarity < threshold) / count(), 4) AS fallback_rate
        FROM {db}.intent_scores FINAL WHERE {in_window} GROUP BY language, route ORDER BY language, route""")
    data.worst_requests = r.dicts(f"""
        SELECT te.request_id AS request_id, te.model AS model, te.route AS route, te.node_id AS node,
               te.tokens AS tokens, round(te.mean_e, 3) AS `mean entropy (nats)`, a.rules AS alerts
        FROM (
            SELECT request_id, model, route, node_id, sum(length(entropies)) AS tokens,
                   sum(arraySum(entropies)) / greatest(tokens, 1) AS mean_e
            FROM {{db}}.token_entropy FINAL WHERE {{in_window}} GROUP BY request_id, model, route, node_id
            ORDER BY mean_e DESC LIMIT 10
        ) AS te
        LEFT JOIN (
            SELECT request_id, arrayStringConcat(groupUniqArray(rule), ', ') AS rules
            FROM {{db}}.alerts FINAL WHERE {{in_window}} AND rule IN ({rules}) GROUP BY request_id
        ) AS a ON te.request_id = a.request_id
        ORDER BY te.mean_e DESC""")
    # the latest audited requests, with their trace, the engine's timings and their entropy
    latest = f"""SELECT request_id FROM {{db}}.audit_index FINAL WHERE {{in_window}} AND part_index = 0
                  ORDER BY emitted_at DESC, event_id LIMIT {REQUESTS_SHOWN}"""
    data.latest_requests = r.dicts(f"""
        SELECT toFloat64(a.emitted_at) AS at, a.request_id AS request_id, a.trace_id AS trace_id, a.audit_id AS audit_id, a.model AS model,
               a.route AS route, a.adapter AS adapter, a.outcome AS outcome, s.ttft AS `ttft`, s.e2e AS `e2e`,
               s.tokens AS `output tokens`, round(te.mean_e, 3) AS `mean entropy (nats)`, al.rules AS alerts
        FROM (SELECT * FROM {{db}}.audit_index FINAL WHERE {{in_window}} AND request_id IN ({latest}) AND part_index = 0) AS a
        LEFT JOIN (
            SELECT request_id, toNullable(toFloat64(any(ttft_s))) AS ttft, toNullable(toFloat64(any(e2e_s))) AS e2e,
                   any(output_tokens) AS tokens
            FROM {{db}}.spans FINAL WHERE {{in_window}} AND name = '{ENGINE_SPAN}' AND request_id IN ({latest})
            GROUP BY request_id
        ) AS s ON s.request_id = a.request_id
        LEFT JOIN (
            SELECT request_id, toNullable(sum(arraySum(entropies)) / greatest(sum(length(entropies)), 1)) AS mean_e
            FROM {{db}}.token_entropy FINAL WHERE {{in_window}} AND request_id IN ({latest}) GROUP BY request_id
        ) AS te ON te.request_id = a.request_id
        LEFT JOIN (
            SELECT request_id, arrayStringConcat(groupUniqArray(rule), ', ') AS rules
            FROM {{db}}.alerts FINAL WHERE {{in_window}} AND request_id IN ({latest}) GROUP BY request_id
        ) AS al ON al.request_id = a.request_id
        ORDER BY a.emitted_at DESC, a.request_id""")
    data.alerts = r.dicts(f"""
        SELECT toFloat64(emitted_at) AS at, rule, severity, model, route, request_id,
               round(toFloat64(value), 3) AS value, round(toFloat64(threshold), 3) AS threshold, detail
        FROM {{db}}.alerts FINAL WHERE {{in_window}} ORDER BY emitted_at DESC, event_id LIMIT {ALERTS_SHOWN}""")
    data.bad_cases = [
        BadCaseRow(
            emitted_at=float(row["at"]), request_id=row["request_id"], model=row["model"], route=row["route"],
            adapter=row["adapter"], labels=[str(label) for label in row["labels"]], confidence=float(row["confidence"]),
            prompt=row["prompt"], response=row["response"], correction=row["correction"],
            diff=_diff_ops(row["diff"]), minimal_span=(int(row["minimal_span"][0]), int(row["minimal_span"][1]))
            if len(row["minimal_span"]) == 2 else (0, 0),
        )
        for row in r.dicts(f"""
            SELECT toFloat64(emitted_at) AS at, request_id, model, route, adapter, labels, confidence, prompt,
                   response, correction, diff, minimal_span
            FROM {{db}}.bad_cases FINAL WHERE {{in_window}} ORDER BY emitted_at DESC, event_id LIMIT {BAD_CASES_SHOWN}""")
    ]
    data.dead_letters = r.dicts("""
        SELECT source_topic, error_type, count() AS dead_letters FROM {db}.dead_letters FINAL WHERE {in_window}
        GROUP BY source_topic, error_type ORDER BY dead_letters DESC""")
    data.actions = r.dicts("""
        SELECT runbook, action, outcome, dry_run, count() AS actions FROM {db}.actions FINAL WHERE {in_window}
        GROUP BY runbook, action, outcome, dry_run ORDER BY runbook, action, outcome""")


def _diff_ops(stored: str) -> list[tuple[str, str, str]]:
    """The sink stores BadCase.diff as JSON ``[[op, old, new], ...]``; anything else is shown as no diff."""
    try:
        ops = json.loads(stored or "[]")
    except ValueError:
        return []
    return [(str(op[0]), str(op[1]), str(op[2])) for op in ops if isinstance(op, list) and len(op) == 3]


__all__ = ["BadCaseRow", "ReportData", "choose_bin", "choose_bucket", "key_metrics", "load_report_data"]
