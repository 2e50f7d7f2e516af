"""The macro helper expands exactly as the grafana-clickhouse-datasource plugin (pkg/macros) does."""

from __future__ import annotations

import pytest

from dashboards.macros import (
    TimeRange,
    UnknownMacro,
    expand,
    expand_macros,
    expand_variables,
    iter_panels,
)

TR = TimeRange.from_unix(1_700_000_000, 1_700_003_600, interval_s=30)


def test_time_filter_and_bounds():
    assert expand_macros("WHERE $__timeFilter(emitted_at)", TR) == (
        "WHERE emitted_at >= toDateTime(1700000000) AND emitted_at <= toDateTime(1700003600)"
    )
    assert expand_macros("$__fromTime, $__toTime", TR) == "toDateTime(1700000000), toDateTime(1700003600)"
    assert expand_macros("$__fromTime_ms", TR) == "fromUnixTimestamp64Milli(1700000000000)"
    assert expand_macros("$__timeFilter_ms(t)", TR) == (
        "t >= fromUnixTimestamp64Milli(1700000000000) AND t <= fromUnixTimestamp64Milli(1700003600000)"
    )
    assert expand_macros("$__dateFilter(d)", TR) == "d >= toDate('2023-11-14') AND d <= toDate('2023-11-14')"


def test_interval_macros_use_the_panel_interval_and_keep_nested_arguments_whole():
    assert expand_macros("$__timeInterval(toDateTime(x, 'UTC'))", TR) == (
        "toStartOfInterval(toDateTime(toDateTime(x, 'UTC')), INTERVAL 30 second)"
    )
    assert expand_macros("$__timeInterval_ms(t)", TR) == "toStartOfInterval(toDateTime64(t, 3), INTERVAL 30000 millisecond)"
    assert expand_macros("n / $__interval_s", TR) == "n / 30"
    sub_second = TimeRange.from_unix(0, 1, interval_s=0.2)
    assert expand_macros("$__interval_s", sub_second) == "1"  # the plugin's floor of 1 s


def test_variables_are_quoted_as_grafana_sql_datasources_do():
    values = {"model": ["a", "b'c"], "slo": ["0.5"]}
    assert expand_variables("model IN (${model:singlequote})", values) == "model IN ('a','b\\'c')"
    assert expand_variables("ttft <= $slo", values) == "ttft <= 0.5"
    assert expand_variables("x IN ($model)", values) == "x IN ('a','b\\'c')"
    assert expand_variables("${model:csv}", values) == "a,b'c"


def test_variables_first_then_macros():
    sql = "SELECT $__timeInterval(minute) AS t FROM x WHERE $__timeFilter(minute) AND model IN (${model:singlequote})"
    out = expand(sql, TR, {"model": ["m"]})
    assert "$" not in out and "model IN ('m')" in out and "INTERVAL 30 second" in out


@pytest.mark.parametrize("sql", ["$__conditionalAll(a, $x)", "$__timeFilter()", "$__timeFilter(a, b)", "$__fromTime(x)", "$unknown_var"])
def test_unknown_or_misused_macros_fail_loudly(sql):
    with pytest.raises(UnknownMacro):
        expand(sql, TR, {"x": ["1"]})


def test_iter_panels_descends_into_rows_and_skips_textless_panels():
    board = {"panels": [
        {"type": "text", "title": "t"},
        {"type": "stat", "title": "a", "targets": [{"rawSql": "1"}]},
        {"type": "row", "panels": [{"type": "table", "title": "b", "targets": [{"rawSql": "2"}]}]},
    ]}
    assert [p["title"] for p in iter_panels(board)] == ["a", "b"]
