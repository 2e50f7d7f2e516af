"""Every Grafana dashboard: current with its generator, provisioned, and every panel's SQL runs
against the real schema in chDB after a demo run and shows data (or declares why it may not)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from dashboards import generate
from dashboards.macros import (
    TimeRange,
    annotation_queries,
    duration_s,
    iter_panels,
    query_variables,
)
from tests.integration.demo_folder import REPO_ROOT, demo_data_dir, run_module  # noqa: F401 - fixture

DASHBOARD_DIR = REPO_ROOT / "dashboards" / "json"
PROVISIONING = REPO_ROOT / "dashboards" / "provisioning"
DASHBOARD_FILES = sorted(DASHBOARD_DIR.glob("*.json"))


def _load(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def test_committed_json_is_what_the_generator_writes():
    rendered = generate.render()
    assert sorted(rendered) == [p.name for p in DASHBOARD_FILES], "run `python -m dashboards.generate`"
    for path in DASHBOARD_FILES:
        assert path.read_text(encoding="utf-8") == rendered[path.name], f"{path.name} is stale: run `python -m dashboards.generate`"


def test_provisioning_references_the_datasource_and_every_dashboard():
    datasources = yaml.safe_load((PROVISIONING / "datasources" / "clickhouse.yaml").read_text())["datasources"]
    assert len(datasources) == 1
    ds = datasources[0]
    assert ds["type"] == "grafana-clickhouse-datasource" and ds["uid"] == "clickhouse"
    assert ds["jsonData"]["defaultDatabase"] == "entroloop"

    providers = yaml.safe_load((PROVISIONING / "dashboards" / "entroloop.yaml").read_text())["providers"]
    assert [p["type"] for p in providers] == ["file"]
    assert providers[0]["options"]["path"] == "/var/lib/grafana/dashboards/entroloop"
    provider_text = (PROVISIONING / "dashboards" / "entroloop.yaml").read_text()
    uids = set()
    for path in DASHBOARD_FILES:
        assert path.name in provider_text, f"{path.name} is not listed in the provider file"
        board = _load(path)
        uids.add(board["uid"])
        refs = [p["datasource"] for p in iter_panels(board)]
        refs += [t["datasource"] for p in iter_panels(board) for t in p["targets"]]
        refs += [v["datasource"] for v in query_variables(board) if v["type"] == "query"]
        refs += [a["datasource"] for a in annotation_queries(board)] + [a["target"]["datasource"] for a in annotation_queries(board)]
        # every query goes to the server chosen in the `datasource` variable, the provisioned one by default
        assert refs and all(r == {"type": ds["type"], "uid": "${datasource}"} for r in refs), path.name
        chooser = [v for v in query_variables(board) if v["type"] == "datasource"]
        assert [(v["name"], v["query"], v["current"]["value"]) for v in chooser] == [("datasource", ds["type"], ds["uid"])]
    assert len(uids) == len(DASHBOARD_FILES), "dashboard uids must be unique"


def test_rollup_panels_are_never_drawn_finer_than_a_minute():
    """A `*_1m` rollup holds one row per minute: at a 20 s interval `sum(x) / $__interval_s` would
    triple a rate. Grafana raises a panel's interval to its minimum, so every rollup panel sets 1m."""
    rollup_panels = 0
    for path in DASHBOARD_FILES:
        for panel in iter_panels(_load(path)):
            if any(generate.ROLLUP_TABLE.search(t["rawSql"]) for t in panel["targets"]):
                rollup_panels += 1
                assert duration_s(panel.get("interval", "")) >= 60, f"{path.name}: {panel['title']}"
    assert rollup_panels >= 20
    wide = TimeRange.from_unix(0, 6 * 3600, interval_s=20)
    assert wide.for_panel({"interval": "1m"}).interval_s == 60
    assert wide.for_panel({}).interval_s == 20


def test_every_dashboard_marks_adapter_changes():
    for path in DASHBOARD_FILES:
        names = [a["name"] for a in annotation_queries(_load(path))]
        assert names == ["adapter changes"], path.name


def test_dashboards_cover_model_route_node_and_units():
    names = {p.name: {v["name"] for v in query_variables(_load(p))} for p in DASHBOARD_FILES}
    assert {"model", "route", "node"} <= names["entropy.json"]
    assert {"model", "route", "node"} <= names["latency.json"]
    for path in DASHBOARD_FILES:
        for panel in iter_panels(_load(path)):
            assert panel["fieldConfig"]["defaults"].get("unit"), f"{path.name}: {panel['title']} has no unit"


def test_every_panel_query_runs_and_shows_data(demo_data_dir):
    folder, summary = demo_data_dir
    assert summary["rows"]["token_entropy"] > 0 and summary["rows"]["alerts"] > 0
    proc = run_module("tests.integration.dashboard_check_main", str(folder), *map(str, DASHBOARD_FILES))
    report = json.loads(proc.stdout)
    problems, checked, with_data = [], 0, 0
    for name, board in report["dashboards"].items():
        for var, values in board["variables"].items():
            if not values:
                problems.append(f"{name}: variable ${var} has no values")
        for panel in board["panels"]:
            checked += 1
            where = f"{name} / {panel['title']}"
            if "error" in panel:
                problems.append(f"{where}: {panel['error']}\n{panel.get('sql', '')}")
            elif panel["rows"] == 0 and "source_rows" not in panel:
                problems.append(f"{where}: returned no rows and does not declare entroloop.emptyWhen\n{panel['sql']}")
            elif panel["rows"] == 0 and panel["source_rows"] > 0:
                problems.append(f"{where}: returned no rows although its source has {panel['source_rows']}\n{panel['sql']}")
            else:
                with_data += panel["rows"] > 0
    assert not problems, "\n\n".join(problems)
    assert checked >= 40
    # The demo feeds entropy, spans, audit, feedback, fallbacks, alerts and dead letters: most panels show data.
    assert with_data >= 25, f"only {with_data} of {checked} panels showed data"
