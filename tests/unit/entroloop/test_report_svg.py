"""The report's SVG charts: round ticks, escaped labels, one mark per datum, a clear 'no data' frame."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from entroloop.report.data import choose_bucket
from entroloop.report.svg import (
    bar_chart,
    format_value,
    grouped_bar_chart,
    line_chart,
    nice_ticks,
)

SVG = "{http://www.w3.org/2000/svg}"


def _marks(svg: str) -> list[ET.Element]:
    root = ET.fromstring(svg)  # also proves the SVG is well-formed XML
    return [e for e in root.iter() if "data-mark" in e.attrib]


def test_nice_ticks_cover_the_range_with_round_steps():
    assert nice_ticks(0, 0.93) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks(0, 20) == [0, 5, 10, 15, 20]
    ticks = nice_ticks(2.1, 2.1)
    assert ticks[0] <= 2.1 <= ticks[-1]


def test_line_chart_draws_a_line_and_a_point_per_datum_and_escapes_names():
    svg = line_chart("T <1>", {"a&b": [(0, 1.0), (60, 2.0)], "c": [(0, 0.5), (60, 0.7), (120, float("nan"))]})
    marks = _marks(svg)
    assert [m.get("data-mark") for m in marks].count("line") == 2
    assert [m.get("data-mark") for m in marks].count("point") == 4  # NaN dropped
    assert "a&amp;b" in svg and "T &lt;1&gt;" in svg


def test_empty_series_give_a_no_data_frame_without_marks():
    svg = line_chart("x", {}, no_data="nothing stored")
    assert "nothing stored" in svg and _marks(svg) == []
    assert _marks(bar_chart("x", [])) == [] and _marks(grouped_bar_chart("x", {})) == []


def test_bars_show_zero_values_as_a_sliver_and_grouped_bars_per_value():
    marks = _marks(bar_chart("funnel", [("feedback", 10), ("bad cases", 0)]))
    assert len(marks) == 2 and float(marks[1].get("width")) > 0
    grouped = _marks(grouped_bar_chart("lat", {"m1": {"p50": 1.0, "p99": 3.0}, "m2": {"p50": 2.0}}, unit="s"))
    assert len(grouped) == 3


def test_units_and_buckets():
    assert format_value(0.125, "%") == "12.5%"
    assert format_value(0.2, "s") == "200 ms" and format_value(12, "s") == "12 s"
    assert choose_bucket(40) == 2 and choose_bucket(3600) == 120 and choose_bucket(10**9) == 86400
