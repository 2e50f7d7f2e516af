"""Small, dependency-free SVG charts for the operator's report: lines over time, histograms, bars.

Each chart is one ``<svg class="plot">`` string with its own axes, ticks and axis titles (with
units), plus its legend as data (``Chart.legend``: name and colour) that the page writes as HTML
next to it, so legends wrap and stay readable on a phone instead of shrinking with the drawing.
The page is self-contained (no script, font or stylesheet to fetch). Every drawn datum carries
``data-mark`` so a browser test can count what rendered. Sizes are in CSS pixels; the viewBox lets
the page scale the plots to its column.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from html import escape

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22")
WIDTH, HEIGHT = 640, 300
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 78, 18, 22, 46
PLOT_W, PLOT_H = WIDTH - MARGIN_LEFT - MARGIN_RIGHT, HEIGHT - MARGIN_TOP - MARGIN_BOTTOM

Series = Mapping[str, Sequence[tuple[float, float]]]  # name -> [(unix seconds, value)]


@dataclass
class Chart:
    """One drawing and the legend that explains its colours ([(name, colour)], empty when none is needed)."""

    svg: str
    legend: list[tuple[str, str]] = field(default_factory=list)


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values covering [lo, hi] (1, 2, 2.5 or 5 times a power of ten apart)."""
    if not math.isfinite(lo) or not math.isfinite(hi):
        return [0.0]
    if hi <= lo:
        hi = lo + (abs(lo) or 1.0)
    raw = (hi - lo) / max(count, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    start = math.floor(lo / step) * step
    ticks, v = [], start
    while v <= hi + step * 1e-9:
        ticks.append(round(v, 12))
        v += step
    if ticks[-1] < hi:
        ticks.append(round(v, 12))
    return ticks


def format_value(value: float, unit: str = "") -> str:
    """A tick or datum label: ``%`` scales a fraction, ``s`` switches to ms below a second."""
    if unit == "%":
        return f"{value * 100:.3g}%"
    if unit == "s":
        return f"{value * 1000:.3g} ms" if abs(value) < 1 and value else f"{value:.3g} s"
    if abs(value) >= 10_000:
        return f"{value:,.0f}"
    return f"{value:.3g}"


def _time_label(t: float, span_s: float) -> str:
    moment = datetime.fromtimestamp(t, tz=timezone.utc)
    return moment.strftime("%H:%M:%S" if span_s < 600 else "%H:%M" if span_s < 86_400 * 2 else "%m-%d %H:%M")


def _frame(title: str, body: list[str], height: int = HEIGHT) -> str:
    return (
        f'<svg class="plot" role="img" aria-label="{escape(title)}" xmlns="http://www.w3.org/2000/svg" '
        f'viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="12">'
        f"<title>{escape(title)}</title>" + "".join(body) + "</svg>"
    )


def _no_data(title: str, message: str) -> Chart:
    return Chart(_frame(title, [
        f'<rect x="{MARGIN_LEFT}" y="{MARGIN_TOP}" width="{PLOT_W}" height="{PLOT_H}" fill="#f6f6f6" stroke="#ddd"/>',
        f'<text class="no-data" x="{MARGIN_LEFT + PLOT_W / 2}" y="{MARGIN_TOP + PLOT_H / 2}" text-anchor="middle" '
        f'fill="#777">{escape(message)}</text>',
    ]))


def _axis_titles(x_label: str, y_label: str, height: int = HEIGHT) -> list[str]:
    out = []
    if x_label:
        out.append(f'<text class="axis-title" x="{MARGIN_LEFT + PLOT_W / 2}" y="{height - 6}" text-anchor="middle" '
                   f'fill="#444">{escape(x_label)}</text>')
    if y_label:
        out.append(f'<text class="axis-title y" transform="translate(14 {MARGIN_TOP + PLOT_H / 2}) rotate(-90)" '
                   f'text-anchor="middle" fill="#444">{escape(y_label)}</text>')
    return out


def _y_axis(y_ticks: Sequence[float], y: Callable[[float], float], unit: str) -> list[str]:
    out = []
    for v in y_ticks:
        out.append(f'<line x1="{MARGIN_LEFT}" x2="{MARGIN_LEFT + PLOT_W}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#e5e5e5"/>')
        out.append(f'<text class="tick" x="{MARGIN_LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end" fill="#333">'
                   f"{format_value(v, unit)}</text>")
    bottom = y(y_ticks[0])
    out.append(f'<line x1="{MARGIN_LEFT}" x2="{MARGIN_LEFT}" y1="{MARGIN_TOP}" y2="{bottom:.1f}" stroke="#555"/>')
    out.append(f'<line x1="{MARGIN_LEFT}" x2="{MARGIN_LEFT + PLOT_W}" y1="{bottom:.1f}" y2="{bottom:.1f}" stroke="#555"/>')
    return out


def _x_tick(x: float, label: str, anchor: str = "middle") -> list[str]:
    bottom = MARGIN_TOP + PLOT_H
    return [f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{bottom}" y2="{bottom + 4}" stroke="#555"/>',
            f'<text class="tick" x="{x:.1f}" y="{bottom + 17}" text-anchor="{anchor}" fill="#333">{escape(label)}</text>']


def line_chart(title: str, series: Series, unit: str = "", y_label: str = "", x_label: str = "time (UTC)",
               y_min: float | None = 0.0, no_data: str = "no data") -> Chart:
    """Lines over time, one per series, with time and value axes."""
    points = [(t, v) for pts in series.values() for t, v in pts if math.isfinite(v)]
    if not points:
        return _no_data(title, no_data)
    t0, t1 = min(p[0] for p in points), max(p[0] for p in points)
    if t1 == t0:
        t0, t1 = t0 - 30, t1 + 30
    v_lo = min(p[1] for p in points) if y_min is None else min(y_min, min(p[1] for p in points))
    y_ticks = nice_ticks(v_lo, max(p[1] for p in points))
    v0, v1 = y_ticks[0], y_ticks[-1]

    def x(t: float) -> float:
        return MARGIN_LEFT + (t - t0) / (t1 - t0) * PLOT_W

    def y(v: float) -> float:
        return MARGIN_TOP + PLOT_H - (v - v0) / ((v1 - v0) or 1) * PLOT_H

    body = _y_axis(y_ticks, y, unit) + _axis_titles(x_label, y_label)
    for i in range(5):  # time ticks
        t = t0 + (t1 - t0) * i / 4
        body.extend(_x_tick(x(t), _time_label(t, t1 - t0), "end" if i == 4 else "middle"))
    legend = []
    for i, (name, pts) in enumerate(series.items()):
        clean = sorted((t, v) for t, v in pts if math.isfinite(v))
        if not clean:
            continue
        path = " ".join(f"{'M' if j == 0 else 'L'}{x(t):.1f},{y(v):.1f}" for j, (t, v) in enumerate(clean))
        body.append(f'<path data-mark="line" d="{path}" fill="none" stroke="{color(i)}" stroke-width="1.8"/>')
        for t, v in clean if len(clean) <= 80 else ():
            body.append(f'<circle data-mark="point" cx="{x(t):.1f}" cy="{y(v):.1f}" r="2.2" fill="{color(i)}">'
                        f"<title>{escape(name)}: {format_value(v, unit)}</title></circle>")
        legend.append((name, color(i)))
    return Chart(_frame(title, body), legend)


def histogram_chart(title: str, histograms: Mapping[str, Sequence[tuple[float, int]]], bin_width: float,
                    markers: Sequence[tuple[float, str]] = (), x_label: str = "", y_label: str = "",
                    no_data: str = "no data") -> Chart:
    """One translucent histogram per name, as shares of that name's total (so a busy model does not
    dwarf a quiet one), bins ``[low, low + bin_width)``; ``markers`` are dashed vertical lines at x."""
    totals = {name: sum(n for _, n in bins) for name, bins in histograms.items()}
    histograms = {name: bins for name, bins in histograms.items() if totals[name] > 0}
    if not histograms:
        return _no_data(title, no_data)
    lows = [lo for bins in histograms.values() for lo, _ in bins]
    x_ticks = nice_ticks(min([0.0, *lows, *(m for m, _ in markers)]),
                         max([lo + bin_width for lo in lows] + [m for m, _ in markers]), count=6)
    x0, x1 = x_ticks[0], x_ticks[-1]
    top = max(n / totals[name] for name, bins in histograms.items() for _, n in bins)
    y_ticks = nice_ticks(0.0, top)

    def x(v: float) -> float:
        return MARGIN_LEFT + (v - x0) / ((x1 - x0) or 1) * PLOT_W

    def y(v: float) -> float:
        return MARGIN_TOP + PLOT_H - v / (y_ticks[-1] or 1) * PLOT_H

    body = _y_axis(y_ticks, y, "%") + _axis_titles(x_label, y_label)
    for v in x_ticks:
        body.extend(_x_tick(x(v), format_value(v)))
    legend = []
    for i, (name, bins) in enumerate(histograms.items()):
        for lo, n in bins:
            share = n / totals[name]
            body.append(f'<rect data-mark="bar" x="{x(lo):.1f}" y="{y(share):.1f}" width="{max(x(lo + bin_width) - x(lo), 1):.1f}" '
                        f'height="{max(y(0) - y(share), 1):.1f}" fill="{color(i)}" fill-opacity="0.35" stroke="{color(i)}" '
                        f'stroke-width="1"><title>{escape(name)}: {n} requests ({format_value(share, "%")}) '
                        f"in [{lo:g}, {lo + bin_width:g})</title></rect>")
        legend.append((f"{name} ({totals[name]:,} requests)", color(i)))
    for m, label in markers:
        body.append(f'<line data-mark="threshold" x1="{x(m):.1f}" x2="{x(m):.1f}" y1="{MARGIN_TOP}" y2="{MARGIN_TOP + PLOT_H}" '
                    f'stroke="#333" stroke-dasharray="5 4" stroke-width="1.4"/>')
        anchor = "end" if x(m) > MARGIN_LEFT + PLOT_W * 0.7 else "start"
        body.append(f'<text class="marker" x="{x(m) + (-4 if anchor == "end" else 4):.1f}" y="{MARGIN_TOP - 7}" '
                    f'text-anchor="{anchor}" fill="#333">{escape(label)}</text>')
    return Chart(_frame(title, body), legend)


def bar_chart(title: str, bars: Sequence[tuple[str, float]], unit: str = "", no_data: str = "no data",
              value_label: Callable[[float], str] | None = None, x_label: str = "") -> Chart:
    """Horizontal bars, one per (label, value), labelled with their values (a funnel reads top-down)."""
    if not bars:
        return _no_data(title, no_data)
    row_h = 28
    label_w = 230
    plot_w = WIDTH - label_w - 90
    height = 8 + row_h * len(bars) + (30 if x_label else 8)
    top = max((v for _, v in bars if math.isfinite(v)), default=0.0) or 1.0
    body = []
    for i, (label, value) in enumerate(bars):
        y = 8 + i * row_h
        w = max(plot_w * (value / top if math.isfinite(value) else 0.0), 1.5)  # zero still shows a sliver
        text = value_label(value) if value_label else format_value(value, unit)
        body.append(f'<text class="label" x="{label_w - 8}" y="{y + row_h * 0.62:.1f}" text-anchor="end" fill="#333">{escape(label)}</text>')
        body.append(f'<rect data-mark="bar" x="{label_w}" y="{y + 4}" width="{w:.1f}" height="{row_h - 8}" '
                    f'fill="{color(i)}"><title>{escape(label)}: {escape(text)}</title></rect>')
        body.append(f'<text class="label" x="{label_w + w + 6:.1f}" y="{y + row_h * 0.62:.1f}" fill="#333">{escape(text)}</text>')
    if x_label:
        body.append(f'<text class="axis-title" x="{label_w + plot_w / 2}" y="{height - 8}" text-anchor="middle" '
                    f'fill="#444">{escape(x_label)}</text>')
    return Chart(_frame(title, body, height))


def stacked_bar_chart(title: str, rows: Mapping[str, Mapping[str, float | None]], unit: str = "",
                      x_label: str = "", no_data: str = "no data") -> Chart:
    """Horizontal bars, one per row, made of segments laid end to end (e.g. queue, prefill, decode)."""
    segments = list(dict.fromkeys(k for parts in rows.values() for k in parts))
    totals = {name: sum(v for v in parts.values() if v is not None and math.isfinite(v)) for name, parts in rows.items()}
    rows = {name: parts for name, parts in rows.items() if totals[name] > 0}
    if not rows:
        return _no_data(title, no_data)
    row_h, label_w = 34, 200
    plot_w = WIDTH - label_w - 24
    x_ticks = nice_ticks(0.0, max(totals.values()))
    height = 8 + row_h * len(rows) + 50

    def x(v: float) -> float:
        return label_w + v / (x_ticks[-1] or 1) * plot_w

    bottom = 8 + row_h * len(rows)
    body = []
    for v in x_ticks:
        body.append(f'<line x1="{x(v):.1f}" x2="{x(v):.1f}" y1="8" y2="{bottom}" stroke="#e5e5e5"/>')
        body.append(f'<text class="tick" x="{x(v):.1f}" y="{bottom + 17}" text-anchor="middle" fill="#333">{format_value(v, unit)}</text>')
    body.append(f'<line x1="{label_w}" x2="{label_w}" y1="8" y2="{bottom}" stroke="#555"/>')
    for i, (name, parts) in enumerate(rows.items()):
        y = 8 + i * row_h
        body.append(f'<text class="label" x="{label_w - 8}" y="{y + row_h * 0.6:.1f}" text-anchor="end" fill="#333">{escape(name)}</text>')
        start = 0.0
        for si, segment in enumerate(segments):
            v = parts.get(segment)
            if v is None or not math.isfinite(v) or v <= 0:
                continue
            body.append(f'<rect data-mark="bar" x="{x(start):.1f}" y="{y + 5}" width="{max(x(start + v) - x(start), 1):.1f}" '
                        f'height="{row_h - 10}" fill="{color(si)}"><title>{escape(name)} {escape(segment)}: '
                        f"{format_value(v, unit)}</title></rect>")
            start += v
    if x_label:
        body.append(f'<text class="axis-title" x="{label_w + plot_w / 2}" y="{height - 6}" text-anchor="middle" '
                    f'fill="#444">{escape(x_label)}</text>')
    return Chart(_frame(title, body, height), [(s, color(i)) for i, s in enumerate(segments)])


def grouped_bar_chart(title: str, groups: Mapping[str, Mapping[str, float]], unit: str = "", y_label: str = "",
                      x_label: str = "", no_data: str = "no data") -> Chart:
    """Vertical bars grouped by category (e.g. per model: p50, p95, p99)."""
    names = list(dict.fromkeys(k for g in groups.values() for k in g))
    values = [v for g in groups.values() for v in g.values() if math.isfinite(v)]
    if not groups or not values:
        return _no_data(title, no_data)
    y_ticks = nice_ticks(0.0, max(values))

    def y(v: float) -> float:
        return MARGIN_TOP + PLOT_H - v / (y_ticks[-1] or 1) * PLOT_H

    body = _y_axis(y_ticks, y, unit) + _axis_titles(x_label, y_label)
    slot = PLOT_W / len(groups)
    bar_w = slot * 0.8 / max(len(names), 1)
    for gi, (group, bars) in enumerate(groups.items()):
        x0 = MARGIN_LEFT + gi * slot + slot * 0.1
        for ni, name in enumerate(names):
            v = bars.get(name)
            if v is None or not math.isfinite(v):
                continue
            top = y(v)
            body.append(f'<rect data-mark="bar" x="{x0 + ni * bar_w:.1f}" y="{top:.1f}" width="{bar_w * 0.92:.1f}" '
                        f'height="{max(MARGIN_TOP + PLOT_H - top, 1.0):.1f}" fill="{color(ni)}">'
                        f"<title>{escape(group)} {escape(name)}: {format_value(v, unit)}</title></rect>")
        body.append(f'<text class="tick" x="{x0 + slot * 0.4:.1f}" y="{MARGIN_TOP + PLOT_H + 17}" text-anchor="middle" '
                    f'fill="#333">{escape(group)}</text>')
    return Chart(_frame(title, body), [(name, color(ni)) for ni, name in enumerate(names)])


__all__ = ["Chart", "bar_chart", "format_value", "grouped_bar_chart", "histogram_chart", "line_chart", "nice_ticks",
           "stacked_bar_chart"]
