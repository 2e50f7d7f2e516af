"""Small, dependency-free SVG charts for the operator's report: lines over time and horizontal bars.

Each chart is one ``<svg class="plot">`` string with its own axes, ticks and legend, so the HTML
page is self-contained (no script, font or stylesheet to fetch). Every drawn datum carries
``data-mark`` so a browser test can count what rendered. Sizes are in CSS pixels; the viewBox lets
the page scale the plots.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timezone
from html import escape

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#7f7f7f", "#bcbd22")
WIDTH, HEIGHT = 720, 300
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 64, 170, 16, 40

Series = Mapping[str, Sequence[tuple[float, float]]]  # name -> [(unix seconds, value)]


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
        f'viewBox="0 0 {WIDTH} {height}" width="{WIDTH}" height="{height}" font-family="sans-serif" font-size="11">'
        f"<title>{escape(title)}</title>" + "".join(body) + "</svg>"
    )


def _no_data(title: str, message: str) -> str:
    return _frame(title, [
        f'<rect x="{MARGIN_LEFT}" y="{MARGIN_TOP}" width="{WIDTH - MARGIN_LEFT - MARGIN_RIGHT}" '
        f'height="{HEIGHT - MARGIN_TOP - MARGIN_BOTTOM}" fill="#f6f6f6" stroke="#ddd"/>',
        f'<text class="no-data" x="{(WIDTH - MARGIN_RIGHT + MARGIN_LEFT) / 2}" y="{HEIGHT / 2}" text-anchor="middle" '
        f'fill="#777">{escape(message)}</text>',
    ])


def line_chart(title: str, series: Series, unit: str = "", y_min: float | None = 0.0, no_data: str = "no data") -> str:
    """Lines over time, one per series, with time and value axes and a legend on the right."""
    points = [(t, v) for pts in series.values() for t, v in pts if math.isfinite(v)]
    if not points:
        return _no_data(title, no_data)
    t0, t1 = min(p[0] for p in points), max(p[0] for p in points)
    if t1 == t0:
        t0, t1 = t0 - 30, t1 + 30
    v_lo = min(p[1] for p in points) if y_min is None else min(y_min, min(p[1] for p in points))
    y_ticks = nice_ticks(v_lo, max(p[1] for p in points))
    v0, v1 = y_ticks[0], y_ticks[-1]
    plot_w, plot_h = WIDTH - MARGIN_LEFT - MARGIN_RIGHT, HEIGHT - MARGIN_TOP - MARGIN_BOTTOM

    def x(t: float) -> float:
        return MARGIN_LEFT + (t - t0) / (t1 - t0) * plot_w

    def y(v: float) -> float:
        return MARGIN_TOP + plot_h - (v - v0) / ((v1 - v0) or 1) * plot_h

    body = _axes(y_ticks, y, unit)
    for i in range(6):  # time ticks
        t = t0 + (t1 - t0) * i / 5
        body.append(f'<line x1="{x(t):.1f}" x2="{x(t):.1f}" y1="{MARGIN_TOP + plot_h}" y2="{MARGIN_TOP + plot_h + 4}" stroke="#555"/>')
        body.append(f'<text x="{x(t):.1f}" y="{MARGIN_TOP + plot_h + 16}" text-anchor="middle" fill="#333">{_time_label(t, t1 - t0)}</text>')
    body.append(f'<text x="{MARGIN_LEFT + plot_w / 2}" y="{HEIGHT - 6}" text-anchor="middle" fill="#555">time (UTC)</text>')
    for i, (name, pts) in enumerate(series.items()):
        color = PALETTE[i % len(PALETTE)]
        clean = sorted((t, v) for t, v in pts if math.isfinite(v))
        if not clean:
            continue
        path = " ".join(f"{'M' if j == 0 else 'L'}{x(t):.1f},{y(v):.1f}" for j, (t, v) in enumerate(clean))
        body.append(f'<path data-mark="line" d="{path}" fill="none" stroke="{color}" stroke-width="1.8"/>')
        for t, v in clean if len(clean) <= 80 else ():
            body.append(f'<circle data-mark="point" cx="{x(t):.1f}" cy="{y(v):.1f}" r="2.2" fill="{color}">'
                        f"<title>{escape(name)}: {format_value(v, unit)}</title></circle>")
        body.extend(_legend_entry(i, name, color))
    return _frame(title, body)


def bar_chart(title: str, bars: Sequence[tuple[str, float]], unit: str = "", no_data: str = "no data",
              value_label: Callable[[float], str] | None = None) -> str:
    """Horizontal bars, one per (label, value), labelled with their values (a funnel reads top-down)."""
    if not bars:
        return _no_data(title, no_data)
    row_h = 26
    height = MARGIN_TOP + row_h * len(bars) + MARGIN_BOTTOM
    label_w, plot_w = 170, WIDTH - 170 - 110
    top = max((v for _, v in bars if math.isfinite(v)), default=0.0) or 1.0
    body = []
    for i, (label, value) in enumerate(bars):
        y = MARGIN_TOP + i * row_h
        w = max(plot_w * (value / top if math.isfinite(value) else 0.0), 1.5)  # zero still shows a sliver
        text = value_label(value) if value_label else format_value(value, unit)
        body.append(f'<text x="{label_w - 8}" y="{y + row_h * 0.62:.1f}" text-anchor="end" fill="#333">{escape(label)}</text>')
        body.append(f'<rect data-mark="bar" x="{label_w}" y="{y + 4}" width="{w:.1f}" height="{row_h - 8}" '
                    f'fill="{PALETTE[i % len(PALETTE)]}"><title>{escape(label)}: {escape(text)}</title></rect>')
        body.append(f'<text x="{label_w + w + 6:.1f}" y="{y + row_h * 0.62:.1f}" fill="#333">{escape(text)}</text>')
    return _frame(title, body, height)


def grouped_bar_chart(title: str, groups: Mapping[str, Mapping[str, float]], unit: str = "", no_data: str = "no data") -> str:
    """Vertical bars grouped by category (e.g. per model: p50, p95, p99), legend on the right."""
    names = list(dict.fromkeys(k for g in groups.values() for k in g))
    values = [v for g in groups.values() for v in g.values() if math.isfinite(v)]
    if not groups or not values:
        return _no_data(title, no_data)
    y_ticks = nice_ticks(0.0, max(values))
    plot_w, plot_h = WIDTH - MARGIN_LEFT - MARGIN_RIGHT, HEIGHT - MARGIN_TOP - MARGIN_BOTTOM

    def y(v: float) -> float:
        return MARGIN_TOP + plot_h - v / (y_ticks[-1] or 1) * plot_h

    body = _axes(y_ticks, y, unit)
    slot = plot_w / len(groups)
    bar_w = slot * 0.8 / max(len(names), 1)
    for gi, (group, bars) in enumerate(groups.items()):
        x0 = MARGIN_LEFT + gi * slot + slot * 0.1
        for ni, name in enumerate(names):
            v = bars.get(name)
            if v is None or not math.isfinite(v):
                continue
            top = y(v)
            body.append(f'<rect data-mark="bar" x="{x0 + ni * bar_w:.1f}" y="{top:.1f}" width="{bar_w * 0.92:.1f}" '
                        f'height="{max(MARGIN_TOP + plot_h - top, 1.0):.1f}" fill="{PALETTE[ni % len(PALETTE)]}">'
                        f"<title>{escape(group)} {escape(name)}: {format_value(v, unit)}</title></rect>")
        body.append(f'<text x="{x0 + slot * 0.4:.1f}" y="{MARGIN_TOP + plot_h + 16}" text-anchor="middle" fill="#333">{escape(group)}</text>')
    for ni, name in enumerate(names):
        body.extend(_legend_entry(ni, name, PALETTE[ni % len(PALETTE)]))
    return _frame(title, body)


def _axes(y_ticks: Sequence[float], y: Callable[[float], float], unit: str) -> list[str]:
    plot_w = WIDTH - MARGIN_LEFT - MARGIN_RIGHT
    out = []
    for v in y_ticks:
        out.append(f'<line x1="{MARGIN_LEFT}" x2="{MARGIN_LEFT + plot_w}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{MARGIN_LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end" fill="#333">{format_value(v, unit)}</text>')
    bottom = y(y_ticks[0])
    out.append(f'<line x1="{MARGIN_LEFT}" x2="{MARGIN_LEFT}" y1="{MARGIN_TOP}" y2="{bottom:.1f}" stroke="#555"/>')
    out.append(f'<line x1="{MARGIN_LEFT}" x2="{MARGIN_LEFT + plot_w}" y1="{bottom:.1f}" y2="{bottom:.1f}" stroke="#555"/>')
    return out


def _legend_entry(i: int, name: str, color: str) -> list[str]:
    x, y = WIDTH - MARGIN_RIGHT + 14, MARGIN_TOP + 10 + i * 16
    return [
        f'<rect x="{x}" y="{y - 8}" width="10" height="10" fill="{color}"/>',
        f'<text x="{x + 14}" y="{y + 1}" fill="#333">{escape(name[:24])}</text>',
    ]


__all__ = ["bar_chart", "format_value", "grouped_bar_chart", "line_chart", "nice_ticks"]
