"""The report's SVG charts: round ticks, escaped labels, axis titles with units, one mark per datum,
a legend that matches the colours drawn, a clear 'no data' frame."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from entroloop.report.data import choose_bin, choose_bucket, key_metrics
from entroloop.report.svg import (
    bar_chart,
    format_value,
    grouped_bar_chart,
    histogram_chart,
    line_chart,
    nice_ticks,
    stacked_bar_chart,
)


def _marks(svg: str, kind: str | None = None) -> list[ET.Element]:
    root = ET.fromstring(svg)  # also proves the SVG is well-formed XML
    return [e for e in root.iter() if "data-mark" in e.attrib and (kind is None or e.get("data-mark") == kind)]


def _texts(svg: str, cls: str) -> list[str]:
    return [e.text or "" for e in ET.fromstring(svg).iter() if e.get("class", "").split(" ")[0] == cls]


def test_nice_ticks_cover_the_range_with_round_steps():
    assert nice_ticks(0, 0.93) == [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert nice_ticks(0, 20) == [0, 5, 10, 15, 20]
    ticks = nice_ticks(2.1, 2.1)
    assert ticks[0] <= 2.1 <= ticks[-1]


def test_line_chart_draws_a_line_and_a_point_per_datum_and_escapes_names():
    chart = line_chart("T <1>", {"a&b": [(0, 1.0), (60, 2.0)], "c": [(0, 0.5), (60, 0.7), (120, float("nan"))]},
                       y_label="entropy (nats)")
    assert len(_marks(chart.svg, "line")) == 2
    assert len(_marks(chart.svg, "point")) == 4  # NaN dropped
    assert "a&amp;b" in chart.svg and "T &lt;1&gt;" in chart.svg
    assert _texts(chart.svg, "axis-title") == ["time (UTC)", "entropy (nats)"]
    # the legend names each series with the colour its line is drawn in
    strokes = [m.get("stroke") for m in _marks(chart.svg, "line")]
    assert chart.legend == [("a&b", strokes[0]), ("c", strokes[1])]


def test_empty_series_give_a_no_data_frame_without_marks():
    chart = line_chart("x", {}, no_data="nothing stored")
    assert "nothing stored" in chart.svg and _marks(chart.svg) == [] and chart.legend == []
    assert _marks(bar_chart("x", []).svg) == [] and _marks(grouped_bar_chart("x", {}).svg) == []
    assert _marks(histogram_chart("x", {"m": []}, 0.1).svg) == []
    assert _marks(stacked_bar_chart("x", {"m": {"queue": None}}).svg) == []


def test_bars_show_zero_values_as_a_sliver_and_grouped_bars_per_value():
    marks = _marks(bar_chart("funnel", [("feedback", 10), ("bad cases", 0)], x_label="count").svg)
    assert len(marks) == 2 and float(marks[1].get("width")) > 0
    grouped = grouped_bar_chart("lat", {"m1": {"p50": 1.0, "p99": 3.0}, "m2": {"p50": 2.0}}, unit="s", y_label="latency")
    assert len(_marks(grouped.svg)) == 3 and [name for name, _ in grouped.legend] == ["p50", "p99"]


def test_histogram_draws_shares_per_name_and_the_threshold_markers():
    chart = histogram_chart("h", {"busy": [(1.0, 90), (2.0, 10)], "quiet": [(2.0, 1)]}, 0.5,
                            markers=[(1.5, "loop < 1.5"), (4.5, "gibberish > 4.5")],
                            x_label="mean entropy (nats)", y_label="share of requests")
    bars = _marks(chart.svg, "bar")
    assert len(bars) == 3
    heights = [float(b.get("height")) for b in bars]
    # shares, not counts: quiet's one request (100%) is the tallest bar, busy's 90% next, its 10% last
    assert heights[2] > heights[0] > heights[1]
    assert len(_marks(chart.svg, "threshold")) == 2
    assert _texts(chart.svg, "marker") == ["loop < 1.5", "gibberish > 4.5"]
    # the x axis reaches the gibberish marker even though no request got there
    assert max(float(t) for t in _texts(chart.svg, "tick") if "%" not in t) >= 4.5
    assert chart.legend[0][0] == "busy (100 requests)"


def test_stacked_bars_lay_segments_end_to_end():
    chart = stacked_bar_chart("stages", {"m": {"queue": 0.1, "prefill": 0.2, "decode": 0.7}, "n": {"queue": None, "decode": 1.0}},
                              unit="s", x_label="seconds")
    bars = _marks(chart.svg, "bar")
    assert len(bars) == 4  # a missing stage draws nothing
    m = bars[:3]
    for left, right in zip(m, m[1:]):
        assert abs(float(left.get("x")) + float(left.get("width")) - float(right.get("x"))) < 0.2
    assert [name for name, _ in chart.legend] == ["queue", "prefill", "decode"]


def test_units_buckets_bins_and_metrics():
    assert format_value(0.125, "%") == "12.5%"
    assert format_value(0.2, "s") == "200 ms" and format_value(12, "s") == "12 s"
    assert choose_bucket(40) == 2 and choose_bucket(3600) == 120 and choose_bucket(10**9) == 86400
    assert choose_bin(2.0, 5.0) == 0.1 and choose_bin(0.0, 11.9) == 0.5 and choose_bin(1.0, 1.0) == 0.05
    metrics = key_metrics('{"train": {"steps": 3}, "gate": {"adapter_pass_rate": 0.9, "reasons": ["a"]}, "x": 1}')
    assert list(metrics) == ["gate.adapter_pass_rate", "train.steps", "x"]
    assert key_metrics("not json") == {"metrics": "(unreadable JSON)"}
