"""Run every Grafana panel's SQL against one embedded data folder and print the results as JSON.

Runs in its own process because chDB opens one data folder per process (the test session may own
another). Usage: ``python -m tests.integration.dashboard_check_main DATA_DIR DASHBOARD.json...``

Steps, as Grafana would take them: the time range is the span of the stored events (from the
minute the first event falls in to one minute after the last; a 20 s interval, raised to a panel's
minimum as Grafana does), each ``query`` template variable is
run and set to All (every value it returns), custom variables keep their current value, then each
panel's SQL is expanded (``dashboards.macros``) and run. Output: one JSON object with, per
dashboard, the variables' values and per panel its expanded SQL, row count or error, and for an
empty panel that declares ``entroloop.emptyWhen``, the row count of its source.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from dashboards.macros import (
    TimeRange,
    annotation_queries,
    expand,
    iter_panels,
    query_variables,
    variable_sql,
)
from entroloop.contract.settings import load_settings
from entroloop.infra.clickhouse.client import connect

EVENT_TABLES = ("token_entropy", "spans", "audit_index", "feedback", "fallbacks", "alerts", "dead_letters")


def data_time_range(client: Any, interval_s: float = 20.0) -> TimeRange:
    union = " UNION ALL ".join(f"SELECT min(emitted_at) AS lo, max(emitted_at) AS hi FROM entroloop.{t}" for t in EVENT_TABLES)
    lo, hi = client.query(
        f"SELECT toUnixTimestamp(toStartOfMinute(minIf(lo, lo > 0))), toUnixTimestamp(max(hi)) FROM ({union})"
    ).result_rows[0]
    return TimeRange.from_unix(float(lo), float(hi) + 60.0, interval_s)


def resolve_variables(client: Any, dashboard: dict[str, Any], time_range: TimeRange) -> dict[str, list[str]]:
    values: dict[str, list[str]] = {}
    for var in query_variables(dashboard):
        if var["type"] == "query":
            sql = expand(variable_sql(var), time_range, values)
            values[var["name"]] = [str(row[0]) for row in client.query(sql).result_rows]
        elif var["type"] == "datasource":
            continue  # chooses the server, never appears in SQL: this check has one
        elif var["type"] in ("custom", "constant", "textbox"):
            current = var.get("current", {}).get("value", var.get("query", ""))
            values[var["name"]] = current if isinstance(current, list) else [str(current)]
        else:
            raise ValueError(f"variable {var['name']}: type {var['type']} is not handled by the check")
    return values


def check_dashboard(client: Any, dashboard: dict[str, Any], time_range: TimeRange) -> dict[str, Any]:
    variables = resolve_variables(client, dashboard, time_range)
    panels = []
    annotations = [{**a, "title": f"annotation: {a['name']}", "targets": [a["target"]]} for a in annotation_queries(dashboard)]
    for panel in [*iter_panels(dashboard), *annotations]:
        for target in panel["targets"]:
            result: dict[str, Any] = {"title": panel["title"], "refId": target.get("refId", "A")}
            try:
                sql = expand(target["rawSql"], time_range.for_panel(panel), variables)
                result["sql"] = sql
                query = client.query(sql)
                result["rows"] = len(query.result_rows)
                result["columns"] = list(query.column_names)
            except Exception as exc:  # every failure is reported per panel, not as one crash
                result["error"] = f"{type(exc).__name__}: {str(exc)[:1500]}"
            empty_when = panel.get("entroloop", {}).get("emptyWhen")
            if empty_when and result.get("rows") == 0:
                try:
                    count_sql = expand(empty_when["sourceCount"], time_range, variables)
                    result["source_rows"] = int(client.query(count_sql).result_rows[0][0])
                except Exception as exc:  # noqa: BLE001
                    result["error"] = f"emptyWhen.sourceCount failed: {type(exc).__name__}: {str(exc)[:800]}"
            panels.append(result)
    return {"uid": dashboard["uid"], "variables": variables, "panels": panels}


def main(argv: list[str]) -> int:
    data_dir, paths = Path(argv[0]), [Path(p) for p in argv[1:]]
    settings = load_settings(data_dir=data_dir)
    client = connect(settings.resolved_clickhouse_dsn())
    time_range = data_time_range(client)
    report = {
        "time_range": [time_range.start.isoformat(), time_range.end.isoformat()],
        "dashboards": {p.name: check_dashboard(client, json.loads(p.read_text(encoding="utf-8")), time_range) for p in paths},
    }
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
