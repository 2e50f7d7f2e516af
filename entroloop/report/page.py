"""The operator's report as one self-contained HTML page: inline CSS, inline SVG plots, no fetches.

Layout: a grid of cards, two columns on a wide screen and one below 980 px; wide tables scroll
inside their card, so the page itself never scrolls sideways on a phone. Every card's title is
an ``<h2>`` (visible text, not only an SVG ``<title>``), every axis has a title with its unit, and
legends are HTML under the drawing so they wrap instead of shrinking.

A short inline script (no library) marks each plot ``data-rendered="true"`` when the browser laid
out at least one of its marks with a non-empty box, and writes the tally into
``<meta name="entroloop-plots">``: a headless browser's DOM dump then says whether every plot
really rendered, which is what the report test checks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from html import escape
from typing import Any

from entroloop.contract.settings import Settings
from entroloop.report.cases import bad_case_html
from entroloop.report.data import (
    ALERTS_SHOWN,
    BAD_CASES_SHOWN,
    ENGINE_SPAN,
    LATENCY_STAGES,
    REQUESTS_SHOWN,
    ReportData,
)
from entroloop.report.svg import (
    Chart,
    bar_chart,
    format_value,
    grouped_bar_chart,
    histogram_chart,
    line_chart,
    stacked_bar_chart,
)

STYLE = """
*{box-sizing:border-box}
body{font-family:system-ui,sans-serif;margin:0;padding:18px;color:#222;background:#f4f5f7;line-height:1.4}
.page{max-width:1640px;margin:0 auto}
h1{font-size:22px;margin:0 0 4px} h2{font-size:16px;margin:0 0 2px} h4{font-size:13px;margin:0 0 4px;color:#555}
.sub{color:#555;margin:0 0 4px;font-size:13px} .muted{color:#777}
header{margin-bottom:14px} header p{overflow-wrap:anywhere}
.grid{display:grid;grid-template-columns:repeat(2,minmax(0,1fr));gap:16px}
.card{background:#fff;border:1px solid #e1e3e6;border-radius:8px;padding:12px 14px;min-width:0}
.card.wide{grid-column:1/-1}
.unit{color:#666;font-size:12px;margin:0 0 6px}
svg.plot{width:100%;height:auto;display:block}
.legend{list-style:none;display:flex;flex-wrap:wrap;gap:2px 14px;padding:0;margin:6px 0 0;font-size:13px}
.legend li{overflow-wrap:anywhere} .sw{display:inline-block;width:11px;height:11px;margin-right:5px;border-radius:2px;vertical-align:-1px}
.caption{color:#666;font-size:12px;margin:6px 0 0}
.scroll{overflow-x:auto;max-width:100%}
table{border-collapse:collapse;font-size:12px;margin:4px 0} th,td{border-bottom:1px solid #eee;padding:3px 8px;text-align:left;vertical-align:top}
th{background:#fafafa;white-space:nowrap} td.id{white-space:nowrap;font-family:ui-monospace,monospace;font-size:11px} td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
code{font-size:12px;overflow-wrap:anywhere}
.case{border-top:1px solid #eee;padding:10px 0} .case:first-of-type{border-top:0}
.case-head{margin:0 0 6px;font-size:13px;overflow-wrap:anywhere}
.chip{display:inline-block;background:#eef2ff;color:#3730a3;border-radius:10px;padding:0 8px;margin:0 3px;font-size:12px}
.pair{display:grid;grid-template-columns:repeat(2,minmax(0,1fr));gap:12px}
.text{white-space:pre-wrap;overflow-wrap:anywhere;margin:0;font-size:13px;background:#fafafa;border-radius:4px;padding:6px 8px}
mark{background:#fde68a} del{background:#fee2e2;color:#991b1b} ins{background:#dcfce7;color:#166534;text-decoration:none}
.minimal{font-size:13px;margin:6px 0;overflow-wrap:anywhere} .diff-block{font-size:13px;overflow-wrap:anywhere}
ol.diff{margin:4px 0 4px 18px;padding:0} .op{color:#666;font-size:11px;text-transform:uppercase}
details{font-size:13px;margin-top:4px} summary{cursor:pointer;color:#555}
@media (max-width:980px){.grid{grid-template-columns:minmax(0,1fr)} body{padding:8px}}
@media (max-width:700px){.pair{grid-template-columns:minmax(0,1fr)} svg.plot text{font-size:18px}
 svg.plot text.axis-title.y{display:none}}
"""

RENDER_CHECK = """
(function(){
  var plots=document.querySelectorAll('svg.plot'), ok=0;
  plots.forEach(function(svg){
    var box=svg.getBoundingClientRect(), marks=svg.querySelectorAll('[data-mark]'), drawn=0;
    marks.forEach(function(m){var b=m.getBBox(); if(b.width>0||b.height>0){drawn++;}});
    var rendered=box.width>0&&box.height>0&&drawn>0;
    svg.setAttribute('data-marks-drawn', String(drawn));
    svg.setAttribute('data-rendered', rendered?'true':'false');
    if(rendered){ok++;}
  });
  var meta=document.createElement('meta'); meta.name='entroloop-plots';
  meta.content=ok+'/'+plots.length; document.head.appendChild(meta);
})();
"""

# Columns holding unix seconds (shown as UTC) and latency columns in seconds (shown as ms or s).
TIME_COLUMNS = {"at", "registered", "status since", "promoted", "rolled back"}


@dataclass(frozen=True)
class EntropyThresholds:
    """The per-token thresholds of the loop and gibberish rules (ENTROLOOP_LOOP_THRESHOLD_NATS,
    ENTROLOOP_GIBBERISH_THRESHOLD_NATS), marked on the entropy distribution; the defaults are the
    settings' defaults, the command passes the configured values."""

    loop_nats: float = Settings.model_fields["loop_threshold_nats"].default
    gibberish_nats: float = Settings.model_fields["gibberish_threshold_nats"].default


def _when(t: float | None) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC") if t else "–"


def _cell(column: str, value: Any) -> str:
    if value is None:
        return "<td class='num muted'>–</td>"
    if column in TIME_COLUMNS and isinstance(value, (int, float)):
        return f"<td class='num'>{_when(float(value))}</td>"
    if isinstance(value, dict):
        return "<td>" + "<br>".join(f"{escape(str(k))}: {escape(_short(v))}" for k, v in value.items()) + "</td>"
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"<td class='num'>{escape(_short(value))}</td>"
    if column.endswith("_id"):  # ids are copied whole into commands and queries: never wrapped
        return f"<td class='id'>{escape(str(value))}</td>"
    return f"<td>{escape(str(value))}</td>"


def _short(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    return str(value)


def _table(rows: list[dict[str, Any]], empty: str, cell: Callable[[str, Any], str] = _cell) -> str:
    if not rows:
        return f"<p class='sub'>{escape(empty)}</p>"
    head = "".join(f"<th>{escape(str(k))}</th>" for k in rows[0])
    body = "".join("<tr>" + "".join(cell(k, v) for k, v in row.items()) + "</tr>" for row in rows)
    return f"<div class='scroll'><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"


def _legend(chart: Chart) -> str:
    if not chart.legend:
        return ""
    items = "".join(f"<li><span class='sw' style='background:{c}'></span>{escape(name)}</li>" for name, c in chart.legend)
    return f"<ul class='legend'>{items}</ul>"


def _card(title: str, content: str, caption: str = "", unit: str = "", wide: bool = False, key: str = "") -> str:
    """One titled card; ``unit`` is the one-line 'what the axes measure' under the title."""
    ident = f" id='{key}'" if key else ""
    return (f"<section class='card{' wide' if wide else ''}'{ident}><h2>{escape(title)}</h2>"
            + (f"<p class='unit'>{escape(unit)}</p>" if unit else "") + content
            + (f"<p class='caption'>{escape(caption)}</p>" if caption else "") + "</section>")


def _plot(title: str, chart: Chart, caption: str, unit: str, key: str) -> str:
    return _card(title, chart.svg + _legend(chart), caption, unit, key=key)


def _latency_cell(column: str, value: Any) -> str:
    if isinstance(value, float) and column.split(" ")[0] in LATENCY_STAGES:
        return f"<td class='num'>{escape(format_value(value, 's'))}</td>"
    return _cell(column, value)


def render_page(data: ReportData, title: str = "entroloop operator report",
                thresholds: EntropyThresholds | None = None) -> str:
    thresholds = thresholds or EntropyThresholds()
    bucket = f"{data.bucket_s} s buckets"
    no_spans = f"no {ENGINE_SPAN} span with this timing in the window"
    stage_p50 = {row["model"]: {stage: row[f"{stage} p50"] for stage in ("queue", "prefill", "decode")}
                 for row in data.latency_stages}
    cards = [
        _plot("Mean token entropy by model",
              line_chart("Mean token entropy by model", data.entropy, y_label="entropy (nats)",
                         no_data="no token entropy stored in the window"),
              f"Token-weighted mean full-vocabulary entropy per model, {bucket}.",
              "y: mean entropy per generated token, nats · x: time (UTC)", "entropy"),
        _plot("Entropy distribution per request",
              histogram_chart(
                  "Entropy distribution per request", data.entropy_histogram, data.histogram_bin,
                  markers=[(thresholds.loop_nats, f"loop < {thresholds.loop_nats:g}"),
                           (thresholds.gibberish_nats, f"gibberish > {thresholds.gibberish_nats:g}")],
                  x_label="mean entropy of the request (nats)", y_label="share of the model's requests",
                  no_data="no token entropy stored in the window"),
              f"Histogram of each request's token-weighted mean entropy, per model ({data.histogram_bin:g} nats bins). "
              "Dashed: the per-token thresholds of the repetition-loop and gibberish rules; those rules fire on runs "
              "of tokens past them, so a flagged request's mean need not cross a line.",
              "y: share of the model's requests, % · x: mean entropy, nats", "entropy-distribution"),
        _plot("Entropy anomalies per request",
              line_chart("Entropy anomalies per request", data.anomaly_rates, unit="%", y_label="alerts per request",
                         no_data="no request stored in the window"),
              f"Alerts per audited request by rule (repetition loops, gibberish, baseline shifts), {bucket}.",
              "y: alerts / requests, % · x: time (UTC)", "anomalies"),
        _plot("Fallback rate by route",
              line_chart("Fallback rate by route", data.fallback_rates, unit="%", y_label="fallback share",
                         no_data="no request stored in the window"),
              f"Requests answered by a fallback tier over requests served, per route, {bucket}.",
              "y: fallbacks / requests, % · x: time (UTC)", "fallbacks"),
        _plot("Time to first token p50 / p95 / p99",
              line_chart("Time to first token p50 / p95 / p99", data.ttft, unit="s", y_label="time to first token",
                         no_data=no_spans),
              f"From the serving engine's {ENGINE_SPAN} spans, {bucket}.",
              "y: seconds (ticks in ms below 1 s) · x: time (UTC)", "ttft"),
        _plot("Time per output token p50 / p95",
              line_chart("Time per output token p50 / p95", data.tpot, unit="s", y_label="time per output token",
                         no_data=no_spans),
              f"Decode time spread over the tokens after the first (vLLM's TPOT), {ENGINE_SPAN} spans, {bucket}.",
              "y: seconds per output token (ticks in ms) · x: time (UTC)", "tpot"),
        _plot("Request time by stage (median)",
              stacked_bar_chart("Request time by stage (median)", stage_p50, unit="s",
                                x_label="seconds (median of each stage)", no_data=no_spans),
              "Median time in the queue, in prefill and in decode, laid end to end per model. Medians of stages do "
              "not add up exactly to the end-to-end median; the table below has p50 and p95 of each.",
              "x: seconds (ticks in ms below 1 s)", "stages"),
        _plot("End-to-end latency by model",
              grouped_bar_chart("End-to-end latency by model", data.latency_by_model, unit="s",
                                y_label="end-to-end latency", no_data=no_spans),
              "p50 / p95 / p99 of end-to-end request latency per model over the window.",
              "y: seconds (ticks in ms below 1 s) · x: model", "e2e"),
        _plot("Bad-case funnel",
              bar_chart("Bad-case funnel", data.funnel, value_label=lambda v: f"{v:,.0f}", x_label="count in the window"),
              f"Feedback → negative feedback (rating ≤ {data.negative_rating}) → corrections → bad cases → retrain "
              "requests → adapters trained, promoted, rolled back." + (
                  f" Not counted: {data.other_tenant_feedback:,} feedback on answers served to another tenant "
                  "(refused by the bad-case join too)." if data.other_tenant_feedback else ""),
              "bars: number of records in the window", "funnel"),
        _card("Intent similarity by language and route",
              _table(data.intent, "no intent score stored in the window (intent scoring off?)"),
              "Fallback rate: answers whose query-answer similarity fell below their language's threshold.",
              "scores: cosine similarity (0..1) · rate: share of scored pairs", key="intent"),
        _card("Latency breakdown by stage",
              _table(data.latency_stages, no_spans, _latency_cell),
              f"p50 / p95 of queue, prefill, decode, time to first token (ttft), time per output token (tpot) and "
              f"end-to-end (e2e), from the {ENGINE_SPAN} spans the serving engine reports; '–' where the engine did "
              "not report that timing.", "values in ms below 1 s, else s", wide=True, key="latency-breakdown"),
        _card(f"Bad cases (latest {min(len(data.bad_cases), BAD_CASES_SHOWN)} of {data.table_rows.get('bad_cases', 0):,})",
              "".join(bad_case_html(case) for case in data.bad_cases)
              or "<p class='sub'>no bad case in the window (no correction joined an audited answer)</p>",
              "Highlighted: the minimal failing example, the smallest whole-chunk span of the output whose "
              "replacement gives the correction. Labels come from the response rules and the user's error type.",
              wide=True, key="bad-cases"),
        _card("Latest requests", _table(data.latest_requests, "no audited request in the window", _latency_cell),
              f"The {REQUESTS_SHOWN} latest audited answers: their trace id (W3C), the engine's time to first token and "
              "end-to-end time, output tokens, mean entropy and any alert about them. Prompts and answers stay in the "
              "write-once audit log: `entroloop audit get --audit-id AUDIT_ID`.", wide=True, key="requests"),
        _card(f"Latest alerts (up to {ALERTS_SHOWN} of {data.table_rows.get('alerts', 0):,})",
              _table(data.alerts, "no alert in the window"), wide=True, key="alerts"),
        _card("Adapters", _table(data.adapters, "no adapter registered or changing state in the window"),
              "Version: rank among the model's registered adapters (v1 = the first). Status: the latest state "
              "(candidate, canary, promoted, superseded, rolled_back, …) as of the window's end; metrics from the "
              "regression gate and the training run.", wide=True, key="adapters"),
        _card("Highest-entropy requests", _table(data.worst_requests, "no token entropy stored in the window"),
              key="worst-requests"),
        _card("Alert actions", _table(data.actions, "no action recorded in the window"), key="actions"),
        _card("Dead letters", _table(data.dead_letters, "no dead letter in the window: every record decoded"),
              key="dead-letters"),
        _card("Rows in the window", _table([{"table": k, "rows": v} for k, v in data.table_rows.items()], "no table"),
              key="rows"),
    ]
    span = f"{_when(data.start)} to {_when(data.end)}" if data.start is not None else "none stored"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>{escape(title)}</title><style>{STYLE}</style></head>
<body><div class="page">
<header><h1>{escape(title)}</h1>
<p class="sub" id="window"><b>Window:</b> {escape(data.window.describe())}</p>
<p class="sub">Requests in the window: {escape(span)} · database <code>{escape(data.database)}</code> ·
generated {_when(datetime.now(tz=timezone.utc).timestamp())}</p></header>
<main class="grid">{''.join(cards)}</main>
</div>
<script>{RENDER_CHECK}</script>
</body></html>
"""


__all__ = ["EntropyThresholds", "render_page"]
