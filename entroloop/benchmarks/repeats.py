"""Repeated measurements: the median of several runs, their spread and the machine's load.

One run of a benchmark on a shared machine says little: another process can halve it. Every
figure in BENCHMARKS.md is therefore the median of ``runs`` measurements, shown with its spread
(lowest–highest) and the 1-minute load average seen while measuring, so a reader can judge it.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass

DEFAULT_RUNS = 3


@dataclass(frozen=True)
class Repeated:
    """Values of one quantity measured ``len(values)`` times, and the load seen meanwhile."""

    values: tuple[float, ...]
    load_averages: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def low(self) -> float:
        return min(self.values)

    @property
    def high(self) -> float:
        return max(self.values)

    @property
    def runs(self) -> int:
        return len(self.values)

    @property
    def load_average(self) -> float:
        """The highest 1-minute load average seen before or after any run."""
        return max(self.load_averages) if self.load_averages else 0.0

    def spread(self, fmt: str = "{:.3g}") -> str:
        """``'low–high'`` of the runs, e.g. ``'0.97–1.02'``; empty for a single run."""
        if self.runs < 2:
            return ""
        return f"{_fmt(self.low, fmt)}–{_fmt(self.high, fmt)}"


def _fmt(value: float, fmt: str) -> str:
    return f"{value:,.0f}" if abs(value) >= 1000 else fmt.format(value)


def load_average() -> float:
    """The 1-minute load average (0.0 where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


def repeat(measure: Callable[[], float], runs: int = DEFAULT_RUNS) -> Repeated:
    """Call ``measure`` ``runs`` times; keep each value and the load average around each call."""
    if runs < 1:
        raise ValueError("runs must be at least 1")
    values: list[float] = []
    loads: list[float] = []
    for _ in range(runs):
        loads.append(load_average())
        values.append(float(measure()))
        loads.append(load_average())
    return Repeated(tuple(values), tuple(loads))


def repeat_many(measure: Callable[[], dict[str, float]], runs: int = DEFAULT_RUNS) -> dict[str, Repeated]:
    """Like :func:`repeat` for a run that measures several quantities at once (e.g. a baseline
    and a candidate in the same run, so their ratio is taken per run)."""
    if runs < 1:
        raise ValueError("runs must be at least 1")
    per_key: dict[str, list[float]] = {}
    loads: list[float] = []
    for _ in range(runs):
        loads.append(load_average())
        for key, value in measure().items():
            per_key.setdefault(key, []).append(float(value))
        loads.append(load_average())
    return {key: Repeated(tuple(values), tuple(loads)) for key, values in per_key.items()}
