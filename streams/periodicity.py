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


def _longest_period(n: int, max_period: int, min_repeats: float) -> int:
    """The longest period worth comparing in ``n`` tokens: one that fits ``min_repeats`` cycles."""
    return min(max_period, n - 1, int(n / min_repeats))


def find_id_period(ids: np.ndarray, entropies: np.ndarray, max_period: int, min_repeats: float,
                   min_tokens: int) -> Periodicity | None:
    """The longest stretch where token ids repeat with a period of at most ``max_period``."""
    n = ids.size
    if n < 2:
        return None
    found = _compare_lags(ids, np.array([0, n]), np.zeros(n, dtype=np.int64),
                          _longest_period(n, max_period, min_repeats), min_repeats, min_tokens, None, 0.0).get(0)
    if found is None:
        return None
    return Periodicity(found.period, found.start, found.end, "token_ids",
                       autocorrelation(entropies[found.start:found.end].astype(np.float32), found.period))


def find_entropy_period(entropies: np.ndarray, max_period: int, min_repeats: float, min_tokens: int,
                        tolerance_nats: float, tolerance_relative: float) -> Periodicity | None:
    """The longest stretch where ``e[i]`` and ``e[i + p]`` agree within the tolerances (p <= max_period)."""
    values = entropies.astype(np.float32)
    n = values.size
    if n < 2:
        return None
    found = _compare_lags(values, np.array([0, n]), np.zeros(n, dtype=np.int64),
                          _longest_period(n, max_period, min_repeats), min_repeats, min_tokens,
                          (tolerance_nats, tolerance_relative), 0.0).get(0)
    if found is None:
        return None
    return Periodicity(found.period, found.start, found.end, "entropy",
                       autocorrelation(values[found.start:found.end], found.period))


@dataclass(frozen=True)
class Stretch:
    """A periodic stretch of one record of a batch: [start, end) in the record's own coordinates."""

    record: int
    period: int
    start: int
    end: int
    copied_share: float | None = None
    """A near-cycle (``streams/template_repeats.py``): the share of its tokens that copy earlier text,
    ``period`` being the median copy distance. None for an exact period."""

    @property
    def length(self) -> int:
        return self.end - self.start


def periodic_stretches(flat: np.ndarray, bounds: np.ndarray, max_period: int, min_repeats: float,
                       min_tokens: int, tolerance: tuple[float, float] | None = None,
                       min_spread: float = 0.0, recurring: list[int] | None = None) -> dict[int, Stretch]:
    """Per record of a batch, its longest periodic stretch (period <= ``max_period``, at least
    ``min_tokens`` tokens and ``min_repeats`` cycles; ties: the smallest period).

    ``flat`` is every record's values concatenated (``bounds[i]:bounds[i + 1]`` is record ``i``):
    token ids compared exactly, or, with ``tolerance`` = (nats, relative), entropies that match
    within ``nats + relative * max(a, b)``. One vectorised comparison per lag over the whole batch
    (not per record: per-record numpy calls cost more than the arithmetic), never across a record's
    edge. ``min_spread``: a stretch whose values vary less (standard deviation) is not a repetition
    (a flat entropy sequence matches itself at every lag) and is passed over. ``recurring``, when
    given, is filled with the records that passed the prefilter (a run of tokens that recur within
    ``max_period``): the only ones where a near-cycle (``streams/template_repeats.py``) can be.
    """
    n = flat.size
    if n < 2 or len(bounds) < 2:
        return {}
    sizes = np.diff(bounds)
    owner = np.repeat(np.arange(sizes.size), sizes)
    values = flat.astype(np.float32) if tolerance is not None else flat
    # Most records repeat nothing: keep only those where enough consecutive tokens recur within
    # max_period tokens (necessary for any stretch), then compare lags on those alone.
    keep = _recurring_records(values, owner, max_period, min_repeats, min_tokens, tolerance)
    if recurring is not None:
        recurring.extend(keep.tolist())
    if keep.size == 0:
        return {}
    if keep.size < sizes.size:
        kept_bounds = np.concatenate(([0], np.cumsum(sizes[keep])))
        found = _compare_lags(
            np.concatenate([values[bounds[r]:bounds[r + 1]] for r in keep.tolist()]), kept_bounds,
            np.repeat(np.arange(keep.size), sizes[keep]), max_period, min_repeats, min_tokens, tolerance, min_spread)
        return {int(keep[k]): Stretch(int(keep[k]), st.period, st.start, st.end) for k, st in found.items()}
    return _compare_lags(values, bounds, owner, max_period, min_repeats, min_tokens, tolerance, min_spread)


def _shortest_run(max_period: int, min_repeats: float, min_tokens: int) -> int:
    """Fewest consecutive matches at one lag that any acceptable stretch has (r matches at lag p
    make r + p periodic tokens)."""
    return min(max(min_tokens, int(np.ceil(min_repeats * p))) - p for p in range(1, max_period + 1))


def _recurring_records(values: np.ndarray, owner: np.ndarray, max_period: int, min_repeats: float,
                       min_tokens: int, tolerance: tuple[float, float] | None) -> np.ndarray:
    """Indexes of the records with a run of at least ``_shortest_run`` tokens each of which recurs
    (exactly, or within the tolerance) within ``max_period`` tokens.

    A superset of the records ``_compare_lags`` finds a stretch in, never fewer: a run counts only
    inside one record (it ends at the record's last token), while a token may count as recurring
    when its twin is in the next record (at most ``max_period`` tokens at a record's end, which
    costs a record passed on, never one missed). One comparison and one OR per lag over the batch:
    ~4x less than the sort that grouped equal keys before (token ids, fleet batches of 500). For
    entropies, two grids of cells as wide as twice the tolerance, offset by half a cell: two values
    within the tolerance share a cell of one grid."""
    n = values.size
    if tolerance is None:
        keys = [values]
    else:
        width = 2 * (tolerance[0] + tolerance[1] * float(values.max(initial=0.0)))
        if width <= 0:
            keys = [values.view(np.int32)]
        else:
            scaled = values / np.float32(width)
            keys = [np.floor(scaled).astype(np.int64), np.floor(scaled + np.float32(0.5)).astype(np.int64)]
    recurs = np.zeros(n, dtype=np.bool_)
    same = np.empty(n, dtype=np.bool_)
    for lag in range(1, min(max_period, n - 1) + 1):
        width_at_lag = n - lag
        for key in keys:
            np.equal(key[lag:], key[:-lag], out=same[:width_at_lag])
            recurs[:width_at_lag] |= same[:width_at_lag]
    # Maximal runs of recurring tokens, each cut where a record begins.
    record_starts = np.empty(n, dtype=np.bool_)
    record_starts[0] = True
    np.not_equal(owner[1:], owner[:-1], out=record_starts[1:])
    before = np.empty(n, dtype=np.bool_)
    before[0] = False
    before[1:] = recurs[:-1]
    starts = np.flatnonzero(recurs & (record_starts | ~before))
    after = np.empty(n, dtype=np.bool_)
    after[-1] = False
    after[:-1] = recurs[1:] & ~record_starts[1:]
    ends = np.flatnonzero(recurs & ~after) + 1
    marked = np.zeros(int(owner[-1]) + 1, dtype=np.bool_)
    marked[owner[starts[(ends - starts) >= _shortest_run(max_period, min_repeats, min_tokens)]]] = True
    return np.flatnonzero(marked)


def _compare_lags(values: np.ndarray, bounds: np.ndarray, owner: np.ndarray, max_period: int,
                  min_repeats: float, min_tokens: int, tolerance: tuple[float, float] | None,
                  min_spread: float) -> dict[int, Stretch]:
    """``periodic_stretches`` on records that passed the prefilter: every lag, exactly."""
    n = values.size
    # One buffer for every lag's matches, padded to whole 8-byte words: a stretch needs a run of
    # matches long enough to cover a whole aligned block of 8 (or 4, 2) positions, and such a
    # block is one word equal to 0x0101...01, so most lags are dismissed after the comparison
    # and two cheap passes over an eighth of the tokens.
    same_buffer = np.zeros(-(-n // 8) * 8, dtype=np.bool_)
    scratch = np.empty(n, dtype=np.float32) if tolerance is not None else None
    blocks = {8: (np.uint64, 0x0101010101010101), 4: (np.uint32, 0x01010101), 2: (np.uint16, 0x0101)}
    candidates: list[tuple[int, int, int, int]] = []  # (record, length, period, batch start)
    for period in range(1, min(max_period, n - 1) + 1):
        need = max(min_tokens, int(np.ceil(min_repeats * period)))
        width = n - period
        same = same_buffer[:width]
        if tolerance is None:
            np.equal(values[period:], values[:-period], out=same)
        else:
            a, b, diff = values[:-period], values[period:], scratch[:width]  # type: ignore[index]
            np.subtract(a, b, out=diff)
            np.abs(diff, out=diff)
            if tolerance[1]:
                np.less_equal(diff, tolerance[0] + tolerance[1] * np.maximum(a, b), out=same)
            else:
                np.less_equal(diff, tolerance[0], out=same)
        same_buffer[width:] = False
        run = need - period  # matches in a row the shortest acceptable stretch has
        block = next((size for size in (8, 4, 2) if run >= 2 * size - 1), 0)
        if block:
            kind, full = blocks[block]
            if not (same_buffer.view(kind) == kind(full)).any():
                continue
        elif not same.any():
            continue
        same &= owner[period:] == owner[:-period]
        edges = np.flatnonzero(np.diff(np.concatenate(([0], same.view(np.int8), [0]))))
        starts, ends = edges[::2], edges[1::2]
        long = (ends - starts) >= run  # a run of r matches at lag p is r + p periodic tokens
        for start, end in zip(starts[long].tolist(), ends[long].tolist()):
            candidates.append((int(owner[start]), end - start + period, period, start))
    if min_spread and candidates:
        # standard deviation of every candidate stretch at once, from prefix sums
        as_array = np.array(candidates, dtype=np.int64)
        lengths, begins = as_array[:, 1], as_array[:, 3]
        wide = values.astype(np.float64)
        sums = np.concatenate(([0.0], np.cumsum(wide)))
        squares = np.concatenate(([0.0], np.cumsum(wide * wide)))
        mean = (sums[begins + lengths] - sums[begins]) / lengths
        variance = (squares[begins + lengths] - squares[begins]) / lengths - mean * mean
        candidates = [c for c, ok in zip(candidates, (variance >= min_spread * min_spread).tolist()) if ok]
    best: dict[int, Stretch] = {}
    for record, length, period, start in sorted(candidates, key=lambda c: (c[0], -c[1], c[2])):
        if record in best:
            continue
        base = int(bounds[record])
        best[record] = Stretch(record, period, start - base, start - base + length)
    return best


__all__ = ["Periodicity", "Stretch", "autocorrelation", "find_entropy_period", "find_id_period", "periodic_stretches"]
