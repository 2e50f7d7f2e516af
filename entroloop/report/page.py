"""The operator's report as one self-contained HTML page: inline CSS, inline SVG plots, no fetches.

A short inline script (no library) marks each plot ``data-rendered="true"`` when the browser laid
out at least one of its marks with a non-empty box, and writes the tally into
``<meta name="entroloop-plots">``: a headless browser's DOM dump then says whether every plot
really rendered, which is what the report test checks.
"""

from __future__ import annotations

from datetime import datetime, timezone
from html import escape
from typing import Any

from entroloop.report.data import ReportData
from entroloop.report.svg import bar_chart, grouped_bar_chart, line_chart

STYLE = """
body{font-family:system-ui,sans-serif;margin:24px auto;max-width:1540px;color:#222;background:#fff}
h1{font-size:22px;margin:0 0 4px} h2{font-size:16px;margin:0 0 6px} .sub{color:#666;margin:0 0 18px}
.grid{display:flex;flex-wrap:wrap;gap:16px} figure{margin:0;border:1px solid #e3e3e3;border-radius:6px;padding:10px 12px}
figcaption{color:#666;font-size:12px;margin-top:4px;max-width:720px}
svg.plot{max-width:100%;height:auto;display:block}
table{border-collapse:collapse;font-size:12px;margin:6px 0 18px} th,td{border-bottom:1px solid #eee;padding:3px 8px;text-align:left}
th{background:#fafafa} td.num{text-align:right;font-variant-numeric:tabular-nums} section{margin:22px 0}
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


def _when(t: float | None) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC") if t is not None else "–"


def _table(rows: list[dict[str, Any]], empty: str) -> str:
    if not rows:
        return f"<p class='sub'>{escape(empty)}</p>"
    head = "".join(f"<th>{escape(str(k))}</th>" for k in rows[0])
    body = "".join(
        "<tr>" + "".join(
            f"<td class='num'>{v}</td>" if isinstance(v, (int, float)) and not isinstance(v, bool) else f"<td>{escape(str(v))}</td>"
            for v in row.values()
        ) + "</tr>"
        for row in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _figure(svg: str, caption: str) -> str:
    return f"<figure>{svg}<figcaption>{escape(caption)}</figcaption></figure>"


def render_page(data: ReportData, title: str = "entroloop operator report") -> str:
    bucket = f"{data.bucket_s} s buckets"
    plots = [
        _figure(line_chart("Mean token entropy by model (nats)", data.entropy, no_data="no token entropy stored"),
                f"Token-weighted mean full-vocabulary entropy per model, {bucket}."),
        _figure(line_chart("Entropy anomalies per request", data.anomaly_rates, unit="%", no_data="no requests stored"),
                f"Alerts per audited request by rule (repetition loops, gibberish, baseline shifts), {bucket}."),
        _figure(line_chart("Fallback rate by route", data.fallback_rates, unit="%", no_data="no requests stored"),
                f"Requests answered by a fallback tier over requests served, per route, {bucket}."),
        _figure(line_chart("Time to first token p50 / p95 / p99", data.ttft, unit="s", no_data="no request spans stored"),
                f"From llm_request spans, {bucket}."),
        _figure(grouped_bar_chart("End-to-end latency by model", data.latency_by_model, unit="s", no_data="no request spans stored"),
                "p50 / p95 / p99 of end-to-end request latency per model over the whole range."),
        _figure(bar_chart("Bad-case funnel", data.funnel, value_label=lambda v: f"{v:,.0f}"),
                "Feedback → negative feedback → corrections → bad cases → retrain requests → adapters trained, promoted, rolled back."),
    ]
    counts = [{"table": k, "rows": v} for k, v in data.table_rows.items()]
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width,initial-scale=1">
<title>{escape(title)}</title><style>{STYLE}</style></head>
<body>
<h1>{escape(title)}</h1>
<p class="sub">Database <code>{escape(data.database)}</code> · events from {_when(data.start)} to {_when(data.end)} ·
generated {_when(datetime.now(tz=timezone.utc).timestamp())}</p>
<div class="grid">{''.join(plots)}</div>
<section><h2>Intent similarity by language and route</h2>{_table(data.intent, "no intent score stored (intent scoring off)")}</section>
<section><h2>Highest-entropy requests</h2>{_table(data.worst_requests, "no token entropy stored")}</section>
<section><h2>Alert actions</h2>{_table(data.actions, "no action recorded")}</section>
<section><h2>Dead letters</h2>{_table(data.dead_letters, "no dead letter: every record decoded")}</section>
<section><h2>Rows stored</h2>{_table(counts, "no table")}</section>
<script>{RENDER_CHECK}</script>
</body></html>
"""


__all__ = ["render_page"]
