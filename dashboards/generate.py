"""Write the Grafana dashboards under ``dashboards/json`` from the panel definitions below.

The JSON files are what Grafana provisions; they are generated so every panel gets the same
datasource, template-variable filters and layout, and so the SQL reads as SQL here. Edit this file
and run ``python -m dashboards.generate``; ``tests/integration/test_dashboards.py`` checks the
committed JSON is current and runs every panel's SQL against a demo run.

Panels that may legitimately show nothing (no adapters before the first training run, no health
gauges in embedded mode) say so with a custom panel field Grafana ignores::

    "entroloop": {"emptyWhen": {"reason": "...", "sourceCount": "SELECT count() FROM ... WHERE $__timeFilter(...)"}}

``sourceCount`` counts the rows the panel is built from; the test accepts an empty panel only while
that count is 0, so a panel that breaks while its source has data still fails.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from entroloop.contract.records import NEGATIVE_RATING
from entroloop.report.feedback_funnel import feedback_funnel_sql

# Every panel, variable and annotation queries the datasource chosen in the `datasource` variable
# (default: the provisioned one, uid `clickhouse`), so one dashboard serves several ClickHouse
# servers (staging, production) without copies.
PROVISIONED_UID = "clickhouse"
DATASOURCE = {"type": "grafana-clickhouse-datasource", "uid": "${datasource}"}
DATASOURCE_VAR: dict[str, Any] = {
    "name": "datasource",
    "label": "ClickHouse",
    "type": "datasource",
    "query": "grafana-clickhouse-datasource",
    "current": {"selected": True, "text": "ClickHouse", "value": PROVISIONED_UID},
    "hide": 0,
    "refresh": 1,
    "regex": "",
    "options": [],
}
# The rollup tables (`*_1m`) hold one row per minute: a panel over them must never be drawn at a
# finer interval, or `sum(x) / $__interval_s` divides a minute's sum by, say, 20 s.
ROLLUP_TABLE = re.compile(r"\b\w+_1m\b")
ROLLUP_MIN_INTERVAL = "1m"
DB = "entroloop"
OUT = Path(__file__).parent / "json"

# Filters every panel applies; "All" expands to every value of the variable.
M = "model IN (${model:singlequote})"
R = "route IN (${route:singlequote})"
N = "node_id IN (${node:singlequote})"
MR = f"{M} AND {R}"

# The plugin's Format enum: 0 time series (long frames pivoted to wide), 1 table.
TIMESERIES, TABLE = 0, 1


def _target(sql: str, fmt: int) -> dict[str, Any]:
    return {
        "refId": "A",
        "datasource": DATASOURCE,
        "editorType": "sql",
        "format": fmt,
        "queryType": "timeseries" if fmt == TIMESERIES else "table",
        "rawSql": sql.strip(),
    }


def panel(
    title: str,
    kind: str,
    sql: str,
    *,
    unit: str = "short",
    description: str = "",
    fmt: int | None = None,
    width: int = 12,
    height: int = 8,
    options: dict[str, Any] | None = None,
    custom: dict[str, Any] | None = None,
    empty_when: tuple[str, str] | None = None,
    decimals: int | None = None,
) -> dict[str, Any]:
    """One panel; ``empty_when`` is (reason, sourceCount SQL) for panels allowed to be empty."""
    if fmt is None:
        fmt = TIMESERIES if kind in ("timeseries", "heatmap") else TABLE
    defaults: dict[str, Any] = {"unit": unit}
    if decimals is not None:
        defaults["decimals"] = decimals
    if custom:
        defaults["custom"] = custom
    p: dict[str, Any] = {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": [_target(sql, fmt)],
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": options or {},
        "gridPos": {"w": width, "h": height},
    }
    if ROLLUP_TABLE.search(sql):
        p["interval"] = ROLLUP_MIN_INTERVAL
    if empty_when:
        p["entroloop"] = {"emptyWhen": {"reason": empty_when[0], "sourceCount": empty_when[1].strip()}}
    return p


def _variable(name: str, label: str, sql: str) -> dict[str, Any]:
    return {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "query": sql,
        "definition": sql,
        "refresh": 2,  # on time range change
        "multi": True,
        "includeAll": True,
        "sort": 1,
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "options": [],
    }


def _constant(name: str, label: str, value: str) -> dict[str, Any]:
    """A single-value custom variable (an SLO threshold the operator can change on the page)."""
    return {
        "name": name,
        "label": label,
        "type": "custom",
        "query": value,
        "multi": False,
        "includeAll": False,
        "current": {"selected": True, "text": value, "value": value},
        "options": [{"selected": True, "text": value, "value": value}],
    }


MODEL_VAR = _variable(
    "model", "model",
    f"SELECT DISTINCT model FROM (SELECT model FROM {DB}.requests_1m UNION ALL SELECT model FROM {DB}.entropy_1m) "
    "WHERE model != '' ORDER BY model",
)
ROUTE_VAR = _variable(
    "route", "route",
    f"SELECT DISTINCT route FROM (SELECT route FROM {DB}.requests_1m UNION ALL SELECT route FROM {DB}.entropy_1m) "
    "WHERE route != '' ORDER BY route",
)
NODE_VAR = _variable(
    "node", "node",
    f"SELECT DISTINCT node_id FROM (SELECT node_id FROM {DB}.latency_1m UNION ALL SELECT node_id FROM {DB}.entropy_1m) "
    "WHERE node_id != '' ORDER BY node_id",
)


# Every adapter state change (loaded, canary share, promoted, rolled back) as a marker on every
# time-series panel: a change in entropy or latency next to a rollout explains itself.
ADAPTER_ANNOTATION: dict[str, Any] = {
    "name": "adapter changes",
    "datasource": DATASOURCE,
    "enable": True,
    "iconColor": "purple",
    "target": {
        "refId": "Anno",
        "datasource": DATASOURCE,
        "editorType": "sql",
        "format": TABLE,
        "queryType": "table",
        "rawSql": (
            f"SELECT at AS time, concat(adapter_id, ': ', status, if(share > 0 AND share < 1, "
            f"concat(' (', toString(round(share * 100)), '% canary)'), '')) AS text, status AS tags "
            f"FROM {DB}.adapter_status WHERE $__timeFilter(at) ORDER BY at"
        ),
    },
    "entroloop": {"emptyWhen": {
        "reason": "no adapter changed state in the range (none before the first training run)",
        "sourceCount": f"SELECT count() FROM {DB}.adapter_status WHERE $__timeFilter(at)",
    }},
}


def dashboard(uid: str, title: str, description: str, panels: list[dict[str, Any]], variables: list[dict[str, Any]], tags: list[str]) -> dict[str, Any]:
    """Lay panels out left to right, top to bottom, on Grafana's 24-column grid."""
    x = y = row_h = 0
    for i, p in enumerate(panels, start=1):
        w, h = p["gridPos"]["w"], p["gridPos"]["h"]
        if x + w > 24:
            x, y, row_h = 0, y + row_h, 0
        p["gridPos"] = {"x": x, "y": y, "w": w, "h": h}
        p["id"] = i
        x += w
        row_h = max(row_h, h)
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["entroloop", *tags],
        "timezone": "utc",
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "graphTooltip": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "timepicker": {"refresh_intervals": ["10s", "30s", "1m", "5m", "15m"]},
        "templating": {"list": [DATASOURCE_VAR, *variables]},
        "annotations": {"list": [ADAPTER_ANNOTATION]},
        "links": [{"type": "dashboards", "tags": ["entroloop"], "asDropdown": True, "title": "entroloop"}],
        "panels": panels,
    }


# --- token entropy ------------------------------------------------------------------------------

def entropy_dashboard() -> dict[str, Any]:
    alerts_per_request = f"""
WITH req AS (
    SELECT $__timeInterval(minute) AS t, model, sum(requests) AS n
    FROM {DB}.requests_1m WHERE $__timeFilter(minute) AND {MR} GROUP BY t, model
), bad AS (
    SELECT $__timeInterval(minute) AS t, model, sum(alerts) AS alerts
    FROM {DB}.anomalies_1m
    WHERE $__timeFilter(minute) AND rule = '{{rule}}' AND {MR} AND subject_node IN (${{node:singlequote}})
    GROUP BY t, model
)
SELECT req.t AS time, req.model AS model, bad.alerts / req.n AS rate
FROM req LEFT JOIN bad ON req.t = bad.t AND req.model = bad.model
ORDER BY time"""
    panels = [
        panel(
            "Mean token entropy by model (heatmap)", "heatmap",
            f"""
SELECT $__timeInterval(minute) AS time, model, sum(entropy_sum) / sum(tokens) AS mean_entropy
FROM {DB}.entropy_1m
WHERE $__timeFilter(minute) AND {MR} AND {N}
GROUP BY time, model ORDER BY time""",
            unit="none", width=24, decimals=2,
            description="Token-weighted mean entropy (nats) per model and interval, from the entropy_1m rollup.",
            options={
                "calculate": False,
                "yAxis": {"axisPlacement": "left"},
                "rowsFrame": {"layout": "auto"},
                "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64},
                "cellGap": 1,
                "tooltip": {"show": True, "yHistogram": False},
                "legend": {"show": True},
            },
        ),
        panel(
            "Per-request mean entropy p50 / p90 / p99", "timeseries",
            f"""
SELECT time, model, q[1] AS p50, q[2] AS p90, q[3] AS p99 FROM (
    SELECT $__timeInterval(minute) AS time, model,
           quantilesTDigestMerge(0.5, 0.9, 0.99)(mean_entropy_q) AS q
    FROM {DB}.entropy_1m
    WHERE $__timeFilter(minute) AND {MR} AND {N}
    GROUP BY time, model
) ORDER BY time""",
            unit="none", decimals=2, description="Distribution of each request's mean token entropy (nats).",
        ),
        panel(
            "Max token entropy", "timeseries",
            f"""
SELECT $__timeInterval(minute) AS time, model, max(max_entropy) AS max_entropy
FROM {DB}.entropy_1m WHERE $__timeFilter(minute) AND {MR} AND {N}
GROUP BY time, model ORDER BY time""",
            unit="none", decimals=2,
        ),
        panel(
            "Repetition-loop alerts per request", "timeseries", alerts_per_request.replace("{rule}", "repetition_loop"),
            unit="percentunit", description="repetition_loop alerts over requests served (requests_1m), per model.",
        ),
        panel(
            "Gibberish alerts per request", "timeseries", alerts_per_request.replace("{rule}", "gibberish"),
            unit="percentunit", description="gibberish alerts over requests served (requests_1m), per model.",
        ),
        panel(
            "Entropy alerts by rule", "stat",
            f"""
SELECT rule, sum(alerts) AS alerts
FROM {DB}.anomalies_1m
WHERE $__timeFilter(minute) AND rule IN ('repetition_loop', 'gibberish', 'entropy_baseline_shift') AND {MR}
  AND subject_node IN (${{node:singlequote}})
GROUP BY rule ORDER BY rule""",
            width=8, options={"reduceOptions": {"values": True, "calcs": ["lastNotNull"], "fields": "/^alerts$/"}, "textMode": "value_and_name"},
            empty_when=("no entropy alert in the range", f"SELECT count() FROM {DB}.alerts WHERE $__timeFilter(emitted_at) AND rule IN ('repetition_loop', 'gibberish', 'entropy_baseline_shift')"),
        ),
        panel(
            "Mean entropy by node", "bargauge",
            f"""
SELECT node_id, sum(entropy_sum) / sum(tokens) AS mean_entropy
FROM {DB}.entropy_1m WHERE $__timeFilter(minute) AND {MR} AND {N}
GROUP BY node_id ORDER BY node_id""",
            width=16, unit="none", decimals=2,
            options={"orientation": "horizontal", "reduceOptions": {"values": True, "calcs": [], "fields": ""}},
        ),
        panel(
            "Worst requests (highest token entropy)", "table",
            f"""
SELECT te.request_id AS request_id, te.model AS model, te.route AS route, te.node_id AS node, te.tokens AS tokens,
       round(te.mean_e, 3) AS mean_entropy, round(te.max_e, 3) AS max_entropy, a.rules AS alerts, te.first_seen AS first_seen
FROM (
    SELECT request_id, model, route, node_id, sum(length(entropies)) AS tokens,
           sum(arraySum(entropies)) / greatest(tokens, 1) AS mean_e,
           max(arrayMax(if(empty(entropies), [0.], entropies))) AS max_e, min(emitted_at) AS first_seen
    FROM {DB}.token_entropy
    WHERE $__timeFilter(emitted_at) AND {MR} AND {N}
    GROUP BY request_id, model, route, node_id
    ORDER BY mean_e DESC LIMIT 25
) AS te
LEFT JOIN (
    SELECT request_id, arrayStringConcat(groupUniqArray(rule), ', ') AS rules
    FROM {DB}.alerts WHERE $__timeFilter(emitted_at) GROUP BY request_id
) AS a ON te.request_id = a.request_id
ORDER BY mean_entropy DESC""",
            width=24, height=10,
        ),
        panel(
            "Latest entropy alerts", "table",
            f"""
SELECT emitted_at, rule, severity, model, route, subject_node AS node, request_id, token_start, token_end,
       round(value, 3) AS value, threshold, baseline, detail
FROM {DB}.alerts
WHERE $__timeFilter(emitted_at) AND rule IN ('repetition_loop', 'gibberish', 'entropy_baseline_shift') AND {MR}
  AND subject_node IN (${{node:singlequote}})
ORDER BY emitted_at DESC LIMIT 100""",
            width=24, height=10,
            empty_when=("no entropy alert in the range", f"SELECT count() FROM {DB}.alerts WHERE $__timeFilter(emitted_at) AND rule IN ('repetition_loop', 'gibberish', 'entropy_baseline_shift')"),
        ),
    ]
    return dashboard("entroloop-entropy", "entroloop · Token entropy",
                     "Full-vocabulary token entropy per model: distribution, loops, gibberish and the worst requests.",
                     panels, [MODEL_VAR, ROUTE_VAR, NODE_VAR], ["entropy"])


# --- latency SLOs -------------------------------------------------------------------------------

def latency_dashboard() -> dict[str, Any]:
    def quantiles(column: str, title: str) -> dict[str, Any]:
        return panel(
            f"{title} p50 / p95 / p99", "timeseries",
            f"""
SELECT time, model, q[1] AS p50, q[2] AS p95, q[3] AS p99 FROM (
    SELECT $__timeInterval(minute) AS time, model, quantilesTDigestMerge(0.5, 0.95, 0.99)({column}) AS q
    FROM {DB}.latency_1m
    WHERE $__timeFilter(minute) AND name = 'llm_request' AND {MR} AND {N}
    GROUP BY time, model
) ORDER BY time""",
            unit="s", width=8, description=f"{title} from request spans, per model (latency_1m t-digest rollup).",
        )

    slo_filter = f"$__timeFilter(emitted_at) AND name = 'llm_request' AND {MR} AND {N}"
    panels = [
        quantiles("ttft_q", "Time to first token"),
        quantiles("tpot_q", "Time per output token"),
        quantiles("e2e_q", "End-to-end latency"),
        panel(
            "Latency percentiles per model", "table",
            f"""
SELECT model, sum(spans) AS requests, sum(errors) / sum(spans) AS error_rate,
       arrayMap(x -> round(x, 4), quantilesTDigestMerge(0.5, 0.95, 0.99)(ttft_q)) AS ttft_p50_p95_p99,
       arrayMap(x -> round(x, 4), quantilesTDigestMerge(0.5, 0.95, 0.99)(tpot_q)) AS tpot_p50_p95_p99,
       arrayMap(x -> round(x, 3), quantilesTDigestMerge(0.5, 0.95, 0.99)(e2e_q)) AS e2e_p50_p95_p99,
       max(e2e_max) AS e2e_max
FROM {DB}.latency_1m
WHERE $__timeFilter(minute) AND name = 'llm_request' AND {MR} AND {N}
GROUP BY model ORDER BY model""",
            width=24, height=6,
        ),
        panel(
            "TTFT SLO attainment (TTFT ≤ $ttft_slo_s s)", "stat",
            f"SELECT countIf(ttft_s <= $ttft_slo_s) / count() AS attainment FROM {DB}.spans WHERE {slo_filter} AND ttft_s IS NOT NULL",
            unit="percentunit", width=6, decimals=2,
            options={"reduceOptions": {"values": False, "calcs": ["lastNotNull"], "fields": ""}, "colorMode": "background"},
            custom=None,
        ),
        panel(
            "E2E SLO attainment (e2e ≤ $e2e_slo_s s)", "stat",
            f"SELECT countIf(e2e_s <= $e2e_slo_s) / count() AS attainment FROM {DB}.spans WHERE {slo_filter} AND e2e_s IS NOT NULL",
            unit="percentunit", width=6, decimals=2,
            options={"reduceOptions": {"values": False, "calcs": ["lastNotNull"], "fields": ""}, "colorMode": "background"},
        ),
        panel(
            "Request error rate", "timeseries",
            f"""
SELECT $__timeInterval(minute) AS time, model, sum(errors) / sum(spans) AS error_rate
FROM {DB}.latency_1m WHERE $__timeFilter(minute) AND name = 'llm_request' AND {MR} AND {N}
GROUP BY time, model ORDER BY time""",
            unit="percentunit",
        ),
        panel(
            "Where the time goes: queue vs prefill vs decode (mean per request)", "barchart",
            f"""
SELECT model, avg(queue_s) AS queue, avg(prefill_s) AS prefill, avg(decode_s) AS decode
FROM {DB}.spans WHERE {slo_filter}
GROUP BY model ORDER BY model""",
            unit="s", options={"stacking": "normal", "orientation": "horizontal", "xField": "model", "legend": {"showLegend": True}},
        ),
        panel(
            "Queue vs prefill vs decode over time", "timeseries",
            f"""
SELECT $__timeInterval(emitted_at) AS time, avg(queue_s) AS queue, avg(prefill_s) AS prefill, avg(decode_s) AS decode
FROM {DB}.spans WHERE {slo_filter}
GROUP BY time ORDER BY time""",
            unit="s", custom={"stacking": {"mode": "normal", "group": "A"}, "fillOpacity": 40},
        ),
        panel(
            "Output tokens per second", "timeseries",
            f"""
SELECT $__timeInterval(minute) AS time, model, sum(output_tokens) / $__interval_s AS tokens_per_s
FROM {DB}.latency_1m WHERE $__timeFilter(minute) AND name = 'llm_request' AND {MR} AND {N}
GROUP BY time, model ORDER BY time""",
            unit="short",
        ),
    ]
    return dashboard("entroloop-latency", "entroloop · Latency SLOs",
                     "TTFT, TPOT and end-to-end latency percentiles from request spans, and where the time goes.",
                     panels, [MODEL_VAR, ROUTE_VAR, NODE_VAR, _constant("ttft_slo_s", "TTFT SLO (s)", "0.5"),
                              _constant("e2e_slo_s", "E2E SLO (s)", "20")], ["latency", "slo"])


# --- intent similarity and fallbacks ------------------------------------------------------------

def intent_fallback_dashboard() -> dict[str, Any]:
    no_scores = ("the intent scorer has produced no score in the range",
                 f"SELECT count() FROM {DB}.intent_scores WHERE $__timeFilter(emitted_at)")
    panels = [
        panel(
            "Intent similarity distribution", "barchart",
            f"""
SELECT toString(round(floor(similarity * 20) / 20, 2)) AS bucket, count() AS scores
FROM {DB}.intent_scores WHERE $__timeFilter(emitted_at) AND {MR}
GROUP BY bucket ORDER BY bucket""",
            description="Cosine similarity of query and answer embeddings, in 0.05 buckets.",
            options={"xField": "bucket", "orientation": "vertical"}, empty_when=no_scores,
        ),
        panel(
            "Intent similarity p10 / p50 by route", "timeseries",
            f"""
SELECT time, route, q[1] AS p10, q[2] AS p50 FROM (
    SELECT $__timeInterval(minute) AS time, route, quantilesTDigestMerge(0.1, 0.5)(similarity_q) AS q
    FROM {DB}.similarity_1m WHERE $__timeFilter(minute) AND {MR}
    GROUP BY time, route
) ORDER BY time""",
            unit="none", decimals=3, empty_when=no_scores,
        ),
        panel(
            "Below-threshold (off-intent) rate by language and route", "timeseries",
            f"""
SELECT $__timeInterval(minute) AS time, concat(language, ' / ', route) AS language_route,
       sum(below_threshold) / sum(scores) AS off_intent_rate
FROM {DB}.similarity_1m WHERE $__timeFilter(minute) AND {MR}
GROUP BY time, language_route ORDER BY time""",
            unit="percentunit", empty_when=no_scores,
        ),
        panel(
            "Fallback rate by route and tier", "timeseries",
            f"""
WITH req AS (
    SELECT $__timeInterval(minute) AS t, route, sum(requests) AS n
    FROM {DB}.requests_1m WHERE $__timeFilter(minute) AND {MR} GROUP BY t, route
), fb AS (
    SELECT $__timeInterval(minute) AS t, route, to_tier, sum(fallbacks) AS n
    FROM {DB}.fallbacks_1m WHERE $__timeFilter(minute) AND {MR} GROUP BY t, route, to_tier
)
SELECT fb.t AS time, concat(fb.route, ' → ', fb.to_tier) AS series, fb.n / req.n AS fallback_rate
FROM fb INNER JOIN req ON fb.t = req.t AND fb.route = req.route
ORDER BY time""",
            unit="percentunit", description="Fallbacks over requests served, per route and target tier.",
        ),
        panel(
            "Fallback rate by route, tier and reason", "table",
            f"""
SELECT fb.route AS route, fb.from_tier AS from_tier, fb.to_tier AS to_tier, fb.reason AS reason, fb.n AS fallbacks,
       req.n AS requests, round(fb.n / req.n, 4) AS rate
FROM (
    SELECT route, from_tier, to_tier, reason, sum(fallbacks) AS n FROM {DB}.fallbacks_1m
    WHERE $__timeFilter(minute) AND {MR} GROUP BY route, from_tier, to_tier, reason
) AS fb
INNER JOIN (
    SELECT route, sum(requests) AS n FROM {DB}.requests_1m WHERE $__timeFilter(minute) AND {MR} GROUP BY route
) AS req ON fb.route = req.route
ORDER BY rate DESC""",
        ),
        panel(
            "Fallback rate, 5-minute windows (fallback monitor)", "timeseries",
            f"""
SELECT toDateTime(toUInt32OrZero(JSONExtractString(labels, 'window_end'))) AS time,
       concat(JSONExtractString(labels, 'model'), ' ', JSONExtractString(labels, 'route'), ' tier ',
              JSONExtractString(labels, 'tier')) AS series,
       max(value) AS fallback_rate
FROM {DB}.health
WHERE $__timeFilter(emitted_at) AND component = 'fallback_rates' AND metric = 'fallback_rate_5m'
  AND JSONExtractString(labels, 'model') IN (${{model:singlequote}}) AND JSONExtractString(labels, 'route') IN (${{route:singlequote}})
GROUP BY time, series ORDER BY time""",
            unit="percentunit", width=24,
            description="The closed 5-minute hopping windows the fallback monitor publishes (Health fallback_rate_5m); "
                        "its SLO alert fires on these.",
            empty_when=("the fallback monitor closed no window in the range",
                        f"SELECT count() FROM {DB}.health WHERE $__timeFilter(emitted_at) AND metric = 'fallback_rate_5m'"),
        ),
        panel(
            "Circuit breaker state by model and route", "table",
            f"""
SELECT r.model AS model, r.route AS route,
       if(b.last_trip >= $__toTime - INTERVAL 5 MINUTE, 'OPEN', 'closed') AS breaker,
       b.trips AS trips, if(b.trips = 0, NULL, b.last_trip) AS last_trip, b.detail AS detail
FROM (
    SELECT DISTINCT model, route FROM {DB}.requests_1m WHERE $__timeFilter(minute) AND {MR}
) AS r
LEFT JOIN (
    SELECT model, route, count() AS trips, max(emitted_at) AS last_trip, argMax(detail, emitted_at) AS detail
    FROM {DB}.alerts WHERE $__timeFilter(emitted_at) AND rule = 'fallback_circuit_breaker'
    GROUP BY model, route
) AS b ON r.model = b.model AND r.route = b.route
ORDER BY breaker DESC, model, route""",
            description="OPEN while a fallback_circuit_breaker alert fired in the 5 minutes before the range's end.",
        ),
        panel(
            "Fallback SLO and circuit-breaker alerts", "table",
            f"""
SELECT emitted_at, rule, severity, model, route, round(value, 4) AS value, threshold, detail, alert_key
FROM {DB}.alerts
WHERE $__timeFilter(emitted_at) AND rule IN ('fallback_rate_slo', 'fallback_circuit_breaker') AND {MR}
ORDER BY emitted_at DESC LIMIT 100""",
            width=24,
            empty_when=("no fallback alert fired in the range",
                        f"SELECT count() FROM {DB}.alerts WHERE $__timeFilter(emitted_at) AND rule IN ('fallback_rate_slo', 'fallback_circuit_breaker')"),
        ),
    ]
    return dashboard("entroloop-intent-fallbacks", "entroloop · Intent & fallbacks",
                     "Intent similarity, off-intent and fallback rates by route and tier, and the circuit breaker.",
                     panels, [MODEL_VAR, ROUTE_VAR], ["intent", "fallbacks"])


# --- bad-case funnel ----------------------------------------------------------------------------

TRAINING_RUNBOOK = "entroloop.training"


def bad_case_dashboard() -> dict[str, Any]:
    no_bad_cases = ("no bad case joined in the range", f"SELECT count() FROM {DB}.bad_cases WHERE $__timeFilter(emitted_at)")
    no_training = ("no retraining step recorded in the range (before the first training run)",
                   f"SELECT count() FROM {DB}.actions WHERE $__timeFilter(emitted_at) AND runbook = '{TRAINING_RUNBOOK}'")
    panels = [
        panel(
            "Bad-case funnel", "bargauge",
            f"""
SELECT stage, n FROM (
    SELECT stage_row.1 AS step, stage_row.2 AS stage, stage_row.3 AS n FROM ({feedback_funnel_sql(DB, '$__timeFilter(emitted_at)', NEGATIVE_RATING)})
    ARRAY JOIN [(1, 'feedback', feedback), (2, 'negative feedback', negative), (3, 'corrections', corrections)] AS stage_row
    UNION ALL SELECT 4, 'bad cases', sum(bad_cases) FROM {DB}.bad_cases_1m WHERE $__timeFilter(minute) AND {MR}
    UNION ALL SELECT 5, 'retrain requests', count() FROM {DB}.retrain_requests FINAL WHERE $__timeFilter(emitted_at) AND {M}
    UNION ALL SELECT 6, 'adapters trained', count() FROM {DB}.adapters FINAL WHERE $__timeFilter(registered_at) AND {M}
    UNION ALL SELECT 7, 'adapters promoted', uniqExactIf(adapter_id, status = 'promoted') FROM {DB}.adapter_status
        WHERE $__timeFilter(at) AND adapter_id IN (SELECT adapter_id FROM {DB}.adapters WHERE {M})
    UNION ALL SELECT 8, 'adapters rolled back', uniqExactIf(adapter_id, status = 'rolled_back') FROM {DB}.adapter_status
        WHERE $__timeFilter(at) AND adapter_id IN (SELECT adapter_id FROM {DB}.adapters WHERE {M})
) ORDER BY step""",
            width=24, height=9,
            description="Feedback → bad cases (by label below) → retrain requests → adapters trained, promoted, rolled back. "
                        "Feedback counts only where it applies to the answer's tenant (as the bad-case join and the report do).",
            options={"orientation": "horizontal", "displayMode": "gradient", "showUnfilled": True,
                     "reduceOptions": {"values": True, "calcs": [], "fields": "/^n$/"}},
        ),
        panel(
            "Feedback by error type", "timeseries",
            f"""
SELECT $__timeInterval(minute) AS time, if(error_type = '', '(none)', error_type) AS error_type, sum(feedback) AS feedback
FROM {DB}.feedback_1m WHERE $__timeFilter(minute)
GROUP BY time, error_type ORDER BY time""",
            custom={"drawStyle": "bars", "stacking": {"mode": "normal", "group": "A"}, "fillOpacity": 70},
        ),
        panel(
            "Bad cases by label", "bargauge",
            f"""
SELECT arrayJoin(if(empty(labels), ['(unlabelled)'], labels)) AS label, count() AS bad_cases
FROM {DB}.bad_cases FINAL WHERE $__timeFilter(emitted_at) AND {MR}
GROUP BY label ORDER BY bad_cases DESC""",
            options={"orientation": "horizontal", "reduceOptions": {"values": True, "calcs": [], "fields": "/^bad_cases$/"}},
            empty_when=no_bad_cases,
        ),
        panel(
            "Bad cases per interval by model", "timeseries",
            f"""
SELECT $__timeInterval(minute) AS time, model, sum(bad_cases) AS bad_cases
FROM {DB}.bad_cases_1m WHERE $__timeFilter(minute) AND {MR}
GROUP BY time, model ORDER BY time""",
            empty_when=no_bad_cases,
        ),
        panel(
            "Response rule violations by rule", "bargauge",
            f"""
SELECT JSONExtractString(labels, 'rule') AS rule, sum(value) AS violations
FROM {DB}.health
WHERE $__timeFilter(emitted_at) AND component = 'response_rules' AND metric = 'rule_violations'
  AND JSONExtractString(labels, 'model') IN (${{model:singlequote}}) AND JSONExtractString(labels, 'route') IN (${{route:singlequote}})
GROUP BY rule ORDER BY violations DESC""",
            description="Answers the response rule checker flagged (numbers, units, currency, dates, JSON schema, compliance).",
            options={"orientation": "horizontal", "reduceOptions": {"values": True, "calcs": [], "fields": "/^violations$/"}},
            empty_when=("the response rule checker published no violation window in the range",
                        f"SELECT count() FROM {DB}.health WHERE $__timeFilter(emitted_at) AND metric = 'rule_violations'"),
        ),
        panel(
            "Retrain requests", "table",
            f"""
SELECT emitted_at, model, category, adapter, bad_case_count, reason, trigger_key
FROM {DB}.retrain_requests FINAL WHERE $__timeFilter(emitted_at) AND {M}
ORDER BY emitted_at DESC LIMIT 100""",
            empty_when=("no retrain request in the range", f"SELECT count() FROM {DB}.retrain_requests WHERE $__timeFilter(emitted_at)"),
        ),
        panel(
            "Adapters and their current state", "table",
            f"""
SELECT a.adapter_id AS adapter_id, a.model AS model, a.registered_at AS registered_at,
       if(s.adapter_id = '', 'registered', s.status) AS status, s.share AS canary_share, s.changed_at AS changed_at,
       a.parent_adapter AS parent, a.trigger_key AS trigger_key
FROM (SELECT * FROM {DB}.adapters FINAL WHERE $__timeFilter(registered_at) AND {M}) AS a
LEFT JOIN (
    SELECT adapter_id, argMax(status, at) AS status, argMax(share, at) AS share, max(at) AS changed_at
    FROM {DB}.adapter_status GROUP BY adapter_id
) AS s ON a.adapter_id = s.adapter_id
ORDER BY registered_at DESC LIMIT 100""",
            width=24, description="The adapter registry's index (migration 0003): candidate, loaded, canary, promoted, rolled_back, unloaded.",
            empty_when=("no adapter registered in the range (before the first training run)",
                        f"SELECT count() FROM {DB}.adapters WHERE $__timeFilter(registered_at)"),
        ),
        panel(
            "Adapter lifecycle (training actions)", "table",
            f"""
SELECT emitted_at, action, alert_key AS subject, outcome, dry_run, detail
FROM {DB}.actions FINAL WHERE $__timeFilter(emitted_at) AND runbook = '{TRAINING_RUNBOOK}'
ORDER BY emitted_at DESC LIMIT 200""",
            width=24, empty_when=no_training,
        ),
    ]
    return dashboard("entroloop-bad-cases", "entroloop · Bad-case funnel",
                     "From user feedback to bad cases, retrain requests and adapters trained, promoted or rolled back.",
                     panels, [MODEL_VAR, ROUTE_VAR], ["bad-cases", "training"])


# --- audit ----------------------------------------------------------------------------------------

def audit_dashboard() -> dict[str, Any]:
    no_actions = ("no alert action executed in the range", f"SELECT count() FROM {DB}.actions WHERE $__timeFilter(emitted_at)")
    no_audit_health = ("the audit writer published no verification gauge (component 'audit') in the range",
                       f"SELECT count() FROM {DB}.health WHERE $__timeFilter(emitted_at) AND component = 'audit'")
    panels = [
        panel(
            "Audit records written", "stat",
            f"SELECT count() AS records FROM {DB}.audit_index FINAL WHERE $__timeFilter(emitted_at) AND {MR}",
            width=6, options={"reduceOptions": {"values": False, "calcs": ["lastNotNull"], "fields": ""}},
        ),
        panel(
            "Audit records per interval by model", "timeseries",
            f"""
SELECT $__timeInterval(minute) AS time, model, sum(requests) AS records
FROM {DB}.requests_1m WHERE $__timeFilter(minute) AND {MR}
GROUP BY time, model ORDER BY time""",
            width=18,
        ),
        panel(
            "Records by tenant, prompt version and adapter", "table",
            f"""
SELECT tenant, prompt_template_version, adapter, sum(requests) AS records,
       sum(prompt_chars) AS prompt_chars, sum(response_chars) AS response_chars
FROM {DB}.requests_1m WHERE $__timeFilter(minute) AND {MR}
GROUP BY tenant, prompt_template_version, adapter ORDER BY records DESC""",
        ),
        panel(
            "Last verification result and WORM backend", "table",
            f"""
SELECT metric, argMax(value, emitted_at) AS value, argMax(labels, emitted_at) AS labels, max(emitted_at) AS at
FROM {DB}.health WHERE $__timeFilter(emitted_at) AND component = 'audit'
GROUP BY metric ORDER BY metric""",
            description="Health gauges of component 'audit': verify_ok (1 = chain verified), with the backend in labels.",
            empty_when=no_audit_health,
        ),
        panel(
            "Dead letters by topic and reason", "table",
            f"""
SELECT source_topic, error_type, count() AS dead_letters, max(emitted_at) AS last_seen, any(reason) AS example_reason
FROM {DB}.dead_letters FINAL WHERE $__timeFilter(emitted_at)
GROUP BY source_topic, error_type ORDER BY dead_letters DESC""",
            empty_when=("no dead letter in the range", f"SELECT count() FROM {DB}.dead_letters WHERE $__timeFilter(emitted_at)"),
        ),
        panel(
            "Alert actions (audit trail)", "table",
            f"""
SELECT emitted_at, runbook, runbook_version, action, alert_key, dry_run, outcome, detail
FROM {DB}.actions FINAL WHERE $__timeFilter(emitted_at)
ORDER BY emitted_at DESC LIMIT 200""",
            empty_when=no_actions,
        ),
    ]
    return dashboard("entroloop-audit", "entroloop · Audit", "Audit records written, verification, dead letters and the actions trail.",
                     panels, [MODEL_VAR, ROUTE_VAR], ["audit"])


# --- pipeline health ------------------------------------------------------------------------------

def _health_metric(title: str, metric: str, unit: str, reason: str) -> dict[str, Any]:
    return panel(
        title, "timeseries",
        f"""
SELECT $__timeInterval(emitted_at) AS time, concat(component, ' ', node_id, ' ', labels) AS series, max(value) AS value
FROM {DB}.health WHERE $__timeFilter(emitted_at) AND metric = '{metric}'
GROUP BY time, series ORDER BY time""",
        unit=unit,
        empty_when=(reason, f"SELECT count() FROM {DB}.health WHERE $__timeFilter(emitted_at) AND metric = '{metric}'"),
    )


EVENT_TABLES = ("token_entropy", "spans", "audit_index", "feedback", "fallbacks", "intent_scores", "bad_cases", "alerts",
                "actions", "retrain_requests", "health", "dead_letters")


def pipeline_dashboard() -> dict[str, Any]:
    union = "\n    UNION ALL ".join(
        f"SELECT '{t}' AS table_name, emitted_at, inserted_at FROM {DB}.{t} WHERE $__timeFilter(emitted_at)" for t in EVENT_TABLES
    )
    panels = [
        _health_metric("Consumer lag (messages)", "consumer_lag", "short", "no stream worker reported consumer lag (embedded mode has no Kafka)"),
        _health_metric("Last commit age", "last_commit_age_s", "s", "no stream worker reported its last commit (embedded mode has no Kafka)"),
        _health_metric("Aggregating processors: input partitions another worker holds (should be 0)",
                       "aggregate_partitions_not_held", "short",
                       "no stream worker runs aggregating processors under Kafka (embedded mode has no Kafka)"),
        _health_metric("Aggregating processors: snapshot size (must stay under the producer's request size)",
                       "snapshot_bytes", "bytes",
                       "no stream worker runs aggregating processors under Kafka (embedded mode has no Kafka)"),
        _health_metric("Aggregating processors: snapshots not written (should be 0)", "snapshots_unwritten", "short",
                       "no stream worker runs aggregating processors under Kafka (embedded mode has no Kafka)"),
        _health_metric("Table recoveries: changelog partitions fetched again after 15 s of silence (should stay 0)",
                       "recovery_refetches", "short", "no stream worker reported its table recoveries (embedded mode has no Kafka)"),
        _health_metric("Publisher spool size", "spool_bytes", "bytes", "no serving node reported its spool (nothing spooled, or embedded mode)"),
        panel(
            "Sink lag (inserted_at − emitted_at) p50 / p99 by table", "table",
            f"""
SELECT table_name, count() AS rows,
       round(quantile(0.5)(toFloat64(inserted_at) - toFloat64(emitted_at)), 3) AS lag_p50_s,
       round(quantile(0.99)(toFloat64(inserted_at) - toFloat64(emitted_at)), 3) AS lag_p99_s
FROM (
    {union}
) GROUP BY table_name ORDER BY table_name""",
            description="Emit → queryable lag per table. The synthetic demo fleet stamps its own clock, so demo lags are not wall-clock lags.",
        ),
        panel(
            "Rows stored per interval by table", "timeseries",
            f"""
SELECT $__timeInterval(emitted_at) AS time, table_name, count() AS rows
FROM (
    {union}
) GROUP BY time, table_name ORDER BY time""",
        ),
        panel(
            "Dead letters per interval", "timeseries",
            f"""
SELECT $__timeInterval(emitted_at) AS time, concat(source_topic, ' ', error_type) AS series, count() AS dead_letters
FROM {DB}.dead_letters WHERE $__timeFilter(emitted_at)
GROUP BY time, series ORDER BY time""",
            custom={"drawStyle": "bars", "fillOpacity": 70},
            empty_when=("no dead letter in the range", f"SELECT count() FROM {DB}.dead_letters WHERE $__timeFilter(emitted_at)"),
        ),
        panel(
            "Latest health gauges", "table",
            f"""
SELECT component, metric, node_id, labels, argMax(value, emitted_at) AS value, max(emitted_at) AS at
FROM {DB}.health WHERE $__timeFilter(emitted_at)
GROUP BY component, metric, node_id, labels ORDER BY component, metric, node_id, labels""",
            width=24,
            empty_when=("no component published a health gauge in the range", f"SELECT count() FROM {DB}.health WHERE $__timeFilter(emitted_at)"),
        ),
    ]
    return dashboard("entroloop-pipeline", "entroloop · Pipeline health",
                     "Consumer lag, commit age, spool size, sink lag and dead letters.", panels, [], ["health"])


DASHBOARDS = {
    "entropy.json": entropy_dashboard,
    "latency.json": latency_dashboard,
    "intent_fallbacks.json": intent_fallback_dashboard,
    "bad_cases.json": bad_case_dashboard,
    "audit.json": audit_dashboard,
    "pipeline_health.json": pipeline_dashboard,
}


def render() -> dict[str, str]:
    """File name -> JSON text of every dashboard."""
    return {name: json.dumps(build(), indent=2, ensure_ascii=False) + "\n" for name, build in DASHBOARDS.items()}


def main() -> None:
    OUT.mkdir(exist_ok=True)
    for name, text in render().items():
        (OUT / name).write_text(text, encoding="utf-8")
        print(OUT / name)


if __name__ == "__main__":
    main()
