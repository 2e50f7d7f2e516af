"""Near-cycles: text that keeps copying what it said a line or two before, with small changes.

A model stuck in a loop does not always repeat one exact cycle of token ids. It alternates two
lines in no fixed order (``%s: 无此目录`` / ``%s: 无此文件``), or repeats a line as a template whose
only change is one word, or cycles through lines of different lengths; ``ids[i] == ids[i + p]``
then fails every few tokens at every lag, and the exact check (``streams/periodicity.py``) finds
nothing. What still holds is that nearly every stretch of ``ngram`` tokens is a copy of one a few
lines back: the repeated-n-gram measure of Welleck et al. (2019, "Neural text degeneration with
unlikelihood training"), taken locally. This module finds the longest stretch of a record where at
least ``min_share`` of the tokens lie inside such a copy, and accepts it when the copied text came
back at least ``min_repeats`` times in all: the stretch (every occurrence but the first) spans
``min_repeats - 1`` copy distances. Something said twice is one copy; a list whose items differ
copies little.

Copies closer than ``ngram`` tokens overlap themselves: that is a cycle of a few tokens, which the
exact check judges, so they do not count here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class TemplateRepeat:
    """[start, end) of a record, the first occurrence included; ``distance`` the median copy distance."""

    start: int
    end: int
    distance: int
    copied_share: float

    @property
    def repeats(self) -> float:
        return (self.end - self.start) / self.distance


def copied_tokens(ids: np.ndarray, ngram: int, lookback: int) -> tuple[np.ndarray, np.ndarray]:
    """(mask of tokens inside an n-gram that copies one ``ngram``..``lookback`` tokens earlier,
    copy distance per n-gram start, 0 where it copies nothing)."""
    n = ids.size
    starts = n - ngram + 1
    copied = np.zeros(n, dtype=np.bool_)
    distance = np.zeros(max(starts, 0), dtype=np.int64)
    if starts < 2:
        return copied, distance
    windows = np.lib.stride_tricks.sliding_window_view(ids.astype(np.int64), ngram)
    # each n-gram as one opaque value of its bytes: equal exactly when the ids are, no hashing
    keys = np.ascontiguousarray(windows).view(np.dtype((np.void, 8 * ngram))).ravel()
    order = np.argsort(keys, kind="stable")  # equal n-grams stay in position order
    ordered = keys[order]
    same = np.flatnonzero(ordered[1:] == ordered[:-1])
    later, earlier = order[same + 1], order[same]  # each occurrence and the one just before it
    gap = later - earlier
    real = (gap >= ngram) & (gap <= lookback)
    distance[later[real]] = gap[real]
    # every token of a copied n-gram is copied
    marks = np.zeros(n + 1, dtype=np.int64)
    np.add.at(marks, later[real], 1)
    np.add.at(marks, later[real] + ngram, -1)
    copied[:] = np.cumsum(marks[:n]) > 0
    return copied, distance


def _longest_dense(copied: np.ndarray, min_share: float) -> tuple[int, int]:
    """The longest [start, end) whose share of copied tokens is at least ``min_share`` (ties: the
    earliest); (0, 0) when no token is copied. Prefix sums of +(1 - share) / -share: a stretch
    qualifies when the sum over it is >= 0; for each start the furthest such end is found by a
    binary search in the suffix maxima (non-increasing)."""
    if not copied.any():
        return 0, 0
    weights = np.where(copied, 1.0 - min_share, -min_share)
    prefix = np.concatenate(([0.0], np.cumsum(weights)))
    suffix_max = np.maximum.accumulate(prefix[::-1])[::-1]
    # furthest j with suffix_max[j] >= prefix[i] (suffix_max is non-increasing in j)
    ends = np.searchsorted(-suffix_max, -prefix - 1e-9, side="right") - 1
    lengths = ends - np.arange(prefix.size)
    best = int(np.argmax(lengths))
    start, end = best, int(ends[best])
    if end <= start:
        return 0, 0
    # the ends that qualify are copied tokens: trimming an uncopied edge only raises the share
    while start < end and not copied[start]:
        start += 1
    while end > start and not copied[end - 1]:
        end -= 1
    return start, end


def template_repeat(ids: np.ndarray, ngram: int, lookback: int, min_share: float, min_repeats: float,
                    min_tokens: int) -> TemplateRepeat | None:
    """The longest near-cycle of ``ids``, or None: a stretch at least ``min_share`` copied, whose
    copies span ``min_repeats - 1`` median copy distances and at least ``min_tokens`` tokens."""
    copied, distance = copied_tokens(ids, ngram, lookback)
    start, end = _longest_dense(copied, min_share)
    if end - start < min_tokens:
        return None
    gaps = distance[start:max(start, end - ngram + 1)]
    gaps = gaps[gaps > 0]
    if gaps.size == 0:
        return None
    typical = int(np.median(gaps))
    if end - start < (min_repeats - 1) * typical:
        return None
    share = float(copied[start:end].mean())
    return TemplateRepeat(max(0, start - typical), end, typical, share)


__all__ = ["TemplateRepeat", "copied_tokens", "template_repeat"]
