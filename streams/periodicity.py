"""Periodic repetition inside a run of tokens: the evidence that a low-entropy run is a loop.

A model stuck in a loop emits the same cycle of 1..``max_period`` token ids again and again; low
entropy alone is not that (a low-temperature code model is nearly certain of most tokens without
repeating itself). With the sampled token ids (``TokenEntropy.token_hashes``) the check is exact:
``ids[i] == ids[i + p]`` over a long stretch. Without them the entropy sequence itself repeats
with the cycle (the same context gives nearly the same distribution at each position of the
cycle), so ``e[i] ~ e[i + p]`` within a tolerance; the normalised autocorrelation at that lag is
reported alongside as a second opinion for the reader of the alert.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Periodicity:
    """The longest periodic stretch found: [start, end) in the run's coordinates, repeating ``period``."""

    period: int
    start: int
    end: int
    source: str
    """"token_ids" (exact id cycle) or "entropy" (entropy sequence repeating within a tolerance)."""
    autocorrelation: float
    """Normalised autocorrelation of the entropies at lag ``period`` over the stretch (1.0 when flat)."""

    @property
    def length(self) -> int:
        return self.end - self.start

    @property
    def repeats(self) -> float:
        return self.length / self.period


def _longest_true_run(mask: np.ndarray) -> tuple[int, int]:
    """(start, length) of the longest run of True in ``mask``; (0, 0) when there is none."""
    if not mask.any():
        return 0, 0
    padded = np.concatenate(([False], mask, [False])).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    starts, ends = edges[::2], edges[1::2]
    best = int(np.argmax(ends - starts))
    return int(starts[best]), int(ends[best] - starts[best])


def autocorrelation(values: np.ndarray, lag: int) -> float:
    """Pearson correlation of ``values[:-lag]`` with ``values[lag:]``; 1.0 for a flat sequence."""
    if lag <= 0 or values.size <= lag + 1:
        return 0.0
    a, b = values[:-lag].astype(np.float64), values[lag:].astype(np.float64)
    sa, sb = a.std(), b.std()
    if sa < 1e-6 or sb < 1e-6:
        return 1.0 if abs(a.mean() - b.mean()) < 1e-3 else 0.0
    return float(np.clip(np.mean((a - a.mean()) * (b - b.mean())) / (sa * sb), -1.0, 1.0))


def _best(matches: list[tuple[int, np.ndarray]], min_repeats: float, min_tokens: int) -> tuple[int, int, int] | None:
    """(period, start, end) of the longest stretch over all lags (ties: the smallest period)."""
    best: tuple[int, int, int] | None = None
    for period, mask in matches:
        start, run = _longest_true_run(mask)
        length = run + period if run else 0
        if length < min_tokens or length < min_repeats * period:
            continue
        if best is None or length > best[2] - best[1]:
            best = (period, start, start + length)
    return best


def find_id_period(ids: np.ndarray, entropies: np.ndarray, max_period: int, min_repeats: float,
                   min_tokens: int) -> Periodicity | None:
    """The longest stretch where token ids repeat with a period of at most ``max_period``."""
    n = ids.size
    matches = [(p, ids[p:] == ids[:-p]) for p in range(1, min(max_period, n - 1) + 1)]
    found = _best(matches, min_repeats, min_tokens)
    if found is None:
        return None
    period, start, end = found
    return Periodicity(period, start, end, "token_ids", autocorrelation(entropies[start:end], period))


def find_entropy_period(entropies: np.ndarray, max_period: int, min_repeats: float, min_tokens: int,
                        tolerance_nats: float, tolerance_relative: float) -> Periodicity | None:
    """The longest stretch where ``e[i]`` and ``e[i + p]`` agree within the tolerances (p <= max_period)."""
    values = entropies.astype(np.float32)
    n = values.size
    matches = []
    for p in range(1, min(max_period, n - 1) + 1):
        a, b = values[:-p], values[p:]
        matches.append((p, np.abs(a - b) <= tolerance_nats + tolerance_relative * np.maximum(a, b)))
    found = _best(matches, min_repeats, min_tokens)
    if found is None:
        return None
    period, start, end = found
    return Periodicity(period, start, end, "entropy", autocorrelation(values[start:end], period))


__all__ = ["Periodicity", "autocorrelation", "find_entropy_period", "find_id_period"]
