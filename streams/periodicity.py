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





@dataclass(frozen=True)
class Stretch:
    """A periodic stretch of one record of a batch: [start, end) in the record's own coordinates."""

    record: int
    period: int
    start: int
    end: int

    @property
    def length(self) -> int:
        return self.end - self.start


def periodic_stretches(flat: np.ndarray, bounds: np.ndarray, max_period: int, min_repeats: float,
                       min_tokens: int, tolerance: tuple[float, float] | None = None,
                       min_spread: float = 0.0) -> dict[int, Stretch]:
    """Per record of a batch, its longest periodic stretch (period <= ``max_period``, at least
    ``min_tokens`` tokens and ``min_repeats`` cycles; ties: the smallest period).

    ``flat`` is every record's values concatenated (``bounds[i]:bounds[i + 1]`` is record ``i``):
    token ids compared exactly, or, with ``tolerance`` = (nats, relative), entropies that match
    within ``nats + relative * max(a, b)``. One vectorised comparison per lag over the whole batch
    (not per record: per-record numpy calls cost more than the arithmetic), never across a record's
    edge. ``min_spread``: a stretch whose values vary less (standard deviation) is not a repetition
    (a flat entropy sequence matches itself at every lag) and is passed over.
    """
    n = flat.size
    if n < 2 or len(bounds) < 2:
        return {}
    sizes = np.diff(bounds)
    owner = np.repeat(np.arange(sizes.size), sizes)
    if tolerance is not None:
        values = flat.astype(np.float32)
    candidates: list[tuple[int, int, int, int]] = []  # (record, length, period, batch start)
    for period in range(1, min(max_period, n - 1) + 1):
        need = max(min_tokens, int(np.ceil(min_repeats * period)))
        if tolerance is None:
            same = flat[period:] == flat[:-period]
        else:
            a, b = values[:-period], values[period:]
            same = np.abs(a - b) <= tolerance[0] + tolerance[1] * np.maximum(a, b)
        same &= owner[period:] == owner[:-period]
        if not same.any():
            continue
        edges = np.flatnonzero(np.diff(np.concatenate(([0], same.view(np.int8), [0]))))
        starts, ends = edges[::2], edges[1::2]
        long = (ends - starts) + period >= need  # a run of r matches at lag p is r + p periodic tokens
        for start, end in zip(starts[long].tolist(), ends[long].tolist()):
            candidates.append((int(owner[start]), end - start + period, period, start))
    best: dict[int, Stretch] = {}
    for record, length, period, start in sorted(candidates, key=lambda c: (c[0], -c[1], c[2])):
        if record in best:
            continue
        if min_spread and float(np.std(flat[start:start + length])) < min_spread:
            continue
        base = int(bounds[record])
        best[record] = Stretch(record, period, start - base, start - base + length)
    return best

__all__ = ["Periodicity", "Stretch", "autocorrelation", "find_entropy_period", "find_id_period", "periodic_stretches"]
