"""The report's queries on real chDB, over a store written by the ClickHouse sink (report_store.py):
every section answers for the window only, the entropy histogram is per request and token-weighted,
the latency breakdown reads the engine's spans, bad cases keep their diff and minimal example, the
adapters table gives version, state and metrics; stored text reaches the page escaped."""

from __future__ import annotations

import re
import uuid

import pytest
from entroloop.sinks.clickhouse.writer import ClickHouseSink

from dashboards.generate import bad_case_dashboard
from dashboards.macros import TimeRange, expand, iter_panels
from entroloop.report import ReportWindow, load_report_data, render_page
from tests.integration.chromium import dump_dom
from tests.integration.report_store import (
    EARLY,
    LATE,
    LATE_WINDOW,
    SCRIPT,
    ReportStore,
    fill,
)


@pytest.fixture(scope="module")
def store(chdb_client, tmp_path_factory) -> ReportStore:
    sink = ClickHouseSink(chdb_client, f"report_{uuid.uuid4().hex[:8]}")
    return fill(sink, tmp_path_factory.mktemp("report-adapters"))


@pytest.fixture(scope="module")
def late(store, chdb_client):
    return load_report_data(chdb_client, store.database, LATE_WINDOW)


@pytest.fixture(scope="module")
def everything(store, chdb_client):
    return load_report_data(chdb_client, store.database)


def test_row_counts_cover_the_window_only(late, everything):
    assert late.window == LATE_WINDOW
    inside = {"token_entropy": 7, "spans": 6, "audit_index": 3, "feedback": 4, "bad_cases": 2, "alerts": 1}
    assert {t: late.table_rows[t] for t in inside} == inside
    whole = {"token_entropy": 11, "spans": 10, "audit_index": 5, "feedback": 5, "bad_cases": 3, "alerts": 2}
    assert {t: everything.table_rows[t] for t in whole} == whole
    # the time axis spans the requests stored in the window (the last: the audit at LATE + 16)
    assert (late.start, late.end) == (pytest.approx(LATE), pytest.approx(LATE + 16))
    assert everything.start == pytest.approx(EARLY)


def test_entropy_histogram_is_per_request_and_token_weighted(late, everything):
    assert late.histogram_bin == pytest.approx(0.1)
    # the chunked request: 10 tokens at 1.0 and 30 at 3.1 weigh to 2.57 (its chunk means average 2.05)
    assert dict(late.entropy_histogram["m-a"]) == {2.0: 3, 2.5: 1}
    assert dict(late.entropy_histogram["m-b"]) == {5.0: 2}
    assert dict(everything.entropy_histogram["m-a"]) == {1.0: 4, 2.0: 3, 2.5: 1}
    assert set(late.entropy) == {"m-a", "m-b"}
    assert all(t >= LATE_WINDOW.since for pts in late.entropy.values() for t, _ in pts)


def test_latency_breakdown_reads_engine_spans_in_the_window(late):
    rows = {row["model"]: row for row in late.latency_stages}
    assert set(rows) == {"m-a", "m-b", "all models"}
    a = rows["m-a"]
    assert a["requests"] == 3  # the gateway's span of late-a-0 is not an engine span
    for stage, median, largest in (("queue", 0.02, 0.03), ("prefill", 0.2, 0.3), ("decode", 2.0, 3.0),
                                   ("ttft", 0.4, 0.6), ("tpot", 0.02, 0.03), ("e2e", 2.22, 3.33)):
        assert a[f"{stage} p50"] == pytest.approx(median, rel=1e-5), stage
        # above the median, never past the window's largest (the early spans took 9 s per stage)
        assert median < a[f"{stage} p95"] <= largest * (1 + 1e-5), stage
    b = rows["m-b"]
    assert b["requests"] == 2 and b["e2e p50"] == pytest.approx(4.0)
    assert b["queue p50"] is None and b["tpot p95"] is None  # not reported by that engine: no number made up
    assert rows["all models"]["requests"] == 5
    assert late.latency_by_model["m-a"]["e2e p50"] == pytest.approx(2.22, rel=1e-5)
    assert all(v <= 0.03 + 1e-6 for pts in late.tpot.values() for _, v in pts) and late.tpot["p50"]


def test_bad_cases_keep_texts_diff_and_minimal_example(late, everything):
    assert [c.request_id for c in late.bad_cases] == ["late-script", "late-case"]  # newest first
    case = late.bad_cases[1]
    assert case.response == "The refund for order 4711 is 12.5 USD."
    assert case.correction == "The refund for order 4711 is 12.8 USD."
    assert case.diff == [("replace", "12.5", "12.8")]
    assert case.minimal_example == ("12.5 USD", "12.8 USD")
    assert {"number", "wrong_amount"} <= set(case.labels)
    assert SCRIPT in late.bad_cases[0].correction  # stored as the user sent it; the page escapes it
    assert len(everything.bad_cases) == 3


def test_latest_requests_join_trace_timings_entropy_and_alerts(late):
    rows = {row["request_id"]: row for row in late.latest_requests}
    assert list(rows) == ["late-script", "late-case", "late-a-0"]  # newest first, the window's audits only
    first = rows["late-a-0"]
    assert (first["trace_id"], first["audit_id"], first["model"]) == ("ab" * 16, "audit-late-a-0", "m-a")
    # the engine's span (not the gateway's 50 s / 100 s one) and the request's token-weighted entropy
    assert first["ttft"] == pytest.approx(0.2, rel=1e-5) and first["e2e"] == pytest.approx(1.11, rel=1e-5)
    assert first["output tokens"] == 100 and first["mean entropy (nats)"] == pytest.approx(2.04, abs=0.01)
    assert rows["late-case"]["ttft"] is None  # no span stored for it: shown as '-', not 0


def test_alerts_funnel_and_tables_follow_the_window(late, everything):
    assert [(a["rule"], a["request_id"]) for a in late.alerts] == [("gibberish", "late-b-1")]
    assert len(everything.alerts) == 2
    funnel = dict(late.funnel)
    assert (funnel["feedback"], funnel["negative feedback"], funnel["corrections"], funnel["bad cases"]) == (3, 2, 2, 2)
    assert dict(everything.funnel)["feedback"] == 4
    # the rating from another tenant than the answer's (its answer served before the window) is left out
    assert late.other_tenant_feedback == 1 and everything.other_tenant_feedback == 1
    assert "Not counted: 1 feedback on answers served to another tenant" in render_page(late)
    assert {r["request_id"] for r in late.worst_requests[:2]} == {"late-b-0", "late-b-1"}  # 5.04 nats
    assert not {r["request_id"] for r in late.worst_requests} & {"early-0", "early-1", "early-2", "early-3"}
    # the adapters were registered now, long after the late window
    assert late.adapters == [] and funnel["adapters trained"] == 0


def test_the_grafana_funnel_counts_the_feedback_the_report_counts(store, chdb_client, late, everything):
    """The Grafana funnel used to read `feedback_1m`, which does not know the answer's tenant, and so
    counted the rival tenant's rating that the report leaves out. Its SQL, expanded as Grafana would
    (model and route set to All), now gives the report's first three steps."""
    (funnel_panel,) = [p for p in iter_panels(bad_case_dashboard()) if p["title"] == "Bad-case funnel"]
    sql = funnel_panel["targets"][0]["rawSql"].replace("entroloop.", f"{store.database}.")
    values = {
        var: [str(v) for (v,) in chdb_client.query(f"SELECT DISTINCT {var} FROM {store.database}.audit_index").result_rows]
        for var in ("model", "route")
    }
    for report, window in ((late, LATE_WINDOW), (everything, ReportWindow(EARLY - 10, LATE + 500))):
        time_range = TimeRange.from_unix(window.since, window.until).for_panel(funnel_panel)
        grafana = dict(chdb_client.query(expand(sql, time_range, values)).result_rows)
        steps = ("feedback", "negative feedback", "corrections")
        assert [grafana[s] for s in steps] == [dict(report.funnel)[s] for s in steps]
    assert [grafana[s] for s in steps] == [4, 3, 3]  # of the 5 stored: the rival's rating is left out


def test_adapters_table_gives_version_state_and_metrics(store, chdb_client):
    data = load_report_data(chdb_client, store.database, ReportWindow(since=store.registry_since))
    rows = {row["adapter"]: row for row in data.adapters}
    ids = store.adapters
    assert set(rows) == set(ids.values())
    assert [rows[ids[r]]["version"] for r in ("a1", "a2", "a3", "b1")] == ["v1", "v2", "v3", "v1"]
    assert [rows[ids[r]]["status"] for r in ("a1", "a2", "a3", "b1")] == ["superseded", "promoted", "rolled_back", "candidate"]
    assert rows[ids["a1"]]["promoted"] is not None and rows[ids["a1"]]["rolled back"] is None
    assert rows[ids["a3"]]["rolled back"] is not None and rows[ids["a3"]]["promoted"] is None
    assert rows[ids["a2"]]["parent"] == "base model"
    assert list(rows[ids["a1"]]["metrics"])[:2] == ["gate.adapter_pass_rate", "gate.parent_pass_rate"]
    funnel = dict(data.funnel)
    assert (funnel["adapters trained"], funnel["adapters promoted"], funnel["adapters rolled back"]) == (4, 2, 1)

    # as of a moment when a1 was promoted and a2 not yet: states as they were then
    then = load_report_data(chdb_client, store.database, ReportWindow(store.registry_since, store.promoted_until))
    states = {row["adapter"]: row["status"] for row in then.adapters}
    assert states[ids["a1"]] == "promoted" and states[ids["a2"]] == "candidate"
    assert dict(then.funnel)["adapters promoted"] == 1 and dict(then.funnel)["adapters rolled back"] == 0


def test_a_window_with_nothing_in_it_renders_every_section_empty(store, chdb_client):
    data = load_report_data(chdb_client, store.database, ReportWindow(LATE + 5_000, LATE + 6_000))
    assert data.start is None and not any(data.table_rows[t] for t in ("token_entropy", "spans", "bad_cases"))
    assert not (data.entropy or data.entropy_histogram or data.latency_stages or data.bad_cases or data.alerts)
    html = render_page(data)
    for message in ("no token entropy stored in the window", "no bad case in the window", "no alert in the window"):
        assert message in html


def test_stored_text_is_escaped_in_the_page(late):
    html = render_page(late)
    assert SCRIPT not in html
    assert "&lt;script&gt;document.body.setAttribute(&quot;data-pwned&quot;,&quot;1&quot;)&lt;/script&gt;" in html
    assert len(re.findall(r"<script\b", html)) == 1  # the page's own render check, nothing else
    assert "late-script" in html and "late-b-1" in html  # request ids of bad cases and alerts are visible text


@pytest.mark.browser
def test_a_script_in_a_correction_stays_text_in_the_browser(late, tmp_path):
    page = tmp_path / "report.html"
    page.write_text(render_page(late), encoding="utf-8")
    dom = dump_dom(tmp_path, page)
    assert 'data-pwned="1"' not in dom  # the correction's script never ran
    assert "&lt;script&gt;document.body.setAttribute(" in dom  # it is shown, as text
    assert re.search(r'<meta name="entroloop-plots" content="\d+/\d+">', dom)  # the page's own script did run
