"""Per-(model, route) bands of sustained entropy, learned only from traffic judged normal.

The static rules use one threshold for every model; these bands say what is normal for each:
``low`` is a lower fence of a request's lowest sustained entropy (the minimum of its rolling
median over ``window`` tokens) and ``high`` an upper fence of its highest sustained entropy (the
rolling median's maximum). Fences are Tukey's (quartile -/+ ``fence`` x interquartile range), not
extreme quantiles: with tens of requests an extreme quantile is the most extreme request seen,
and one anomaly learned during warm-up would become the band's edge; quartiles ignore up to a
quarter of them. Sustained, not single tokens, because normal text has short spikes and
dips: a name is a few uncertain tokens, an indentation a few certain ones.

Once a band exists only requests the detector did not flag are learned (a burst of gibberish cannot
widen the band that should catch it). During warm-up every request is learned but those with a
confirmed loop: otherwise a model whose normal level is above the cold-start rule would be flagged
on every request and never get a band. A band is used after ``min_requests`` (tens, not hundreds: the quantile
sketch is exact to one 0.02-nat bin whatever the count). Before that the detector uses its
cold-start rules. State is plain msgspec structs; it lives in the worker's memory (one per
worker, relearned in tens of requests after a restart).
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import numpy as np
from entroloop.streams.entropy_baseline import HistogramQuantileSketch


@dataclass(frozen=True)
class Band:
    """What is normal for one (model, route)."""

    low: float
    high: float
    requests: int

    def as_dict(self) -> dict[str, float | int]:
        return {"low": round(self.low, 3), "high": round(self.high, 3), "n": self.requests}


class _ModelSketches(msgspec.Struct):
    lows: HistogramQuantileSketch
    highs: HistogramQuantileSketch


class BandState(msgspec.Struct):
    """(model, route) key -> sketches of lowest and highest sustained entropy per request."""

    models: dict[str, _ModelSketches] = {}


def sustained(values: np.ndarray, window: int) -> np.ndarray:
    """Rolling median over ``window`` tokens (the whole median when there are fewer tokens).

    A median, not a mean: a spike of a few tokens (a name, a number) shorter than half the window
    leaves it unmoved, while a stretch of gibberish or a loop longer than half the window moves it
    all the way. A mean would let normal spikes into the band and widen it."""
    values = values.astype(np.float32)
    if values.size == 0:
        return values
    if values.size <= window:
        return np.array([float(np.median(values))])
    # The exact median of each window, from one sort of the [windows, window] view: a third of
    # np.median's time at a few hundred tokens (no NaN check; entropies are finite). The view is
    # built by the ndarray constructor over the fresh contiguous copy above and copied before the
    # in-place sort: sliding_window_view's argument checks and as_strided's array-interface round
    # trip each cost about as much as the sort at ~150 tokens (15.9 -> 10.6 µs a call).
    step = values.strides[0]
    view = np.ndarray((values.size - window + 1, window), np.float32, values, 0, (step, step))
    ordered = view.copy()
    ordered.sort(axis=1)
    middle = window // 2
    if window % 2:
        return ordered[:, middle]
    return (ordered[:, middle - 1] + ordered[:, middle]) * np.float32(0.5)


class EntropyBands:
    """Learns and serves the per-(model, route) bands."""

    def __init__(self, window: int = 20, min_requests: int = 20, fence: float = 1.5,
                 half_life_requests: int = 50_000, sample_every: int = 8, state: BandState | None = None) -> None:
        self.window = window
        self.min_requests = min_requests
        self.fence = fence
        # After 4 x min_requests a band is well established; learning one normal request in
        # ``sample_every`` then keeps it following drift at a fraction of the cost (a rolling
        # median per request is the most expensive step of the detector).
        self.sample_every = sample_every
        self._offered: dict[str, int] = {}
        self._cache: dict[str, tuple[int, Band]] = {}
        self.half_life_requests = half_life_requests
        self.state = state or BandState()

    @staticmethod
    def key(model: str, route: str) -> str:
        return f"{model}\x1f{route}"

    def band(self, model: str, route: str) -> Band | None:
        """The band of a (model, route), or None while it has seen fewer than ``min_requests``."""
        key = self.key(model, route)
        sketches = self.state.models.get(key)
        if sketches is None or sketches.lows.seen < self.min_requests:
            return None
        cached = self._cache.get(key)
        if cached is not None and cached[0] == sketches.lows.seen:
            return cached[1]  # quantiles change only when the sketch does
        low_q1, low_q3 = sketches.lows.quantiles((0.25, 0.75))
        high_q1, high_q3 = sketches.highs.quantiles((0.25, 0.75))
        band = Band(
            low=max(0.0, low_q1 - self.fence * (low_q3 - low_q1)),
            high=high_q3 + self.fence * (high_q3 - high_q1),
            requests=sketches.lows.seen,
        )
        self._cache[key] = (sketches.lows.seen, band)
        return band

    def warm(self, model: str, route: str) -> bool:
        sketches = self.state.models.get(self.key(model, route))
        return sketches is not None and sketches.lows.seen >= self.min_requests

    def learn(self, model: str, route: str, values: np.ndarray) -> None:
        """Add one normal request (or chunk) to its (model, route)'s band."""
        if values.size == 0:
            return
        key = self.key(model, route)
        sketches = self.state.models.get(key)
        if sketches is not None and sketches.lows.seen >= 4 * self.min_requests:
            offered = self._offered.get(key, 0) + 1
            self._offered[key] = offered
            if offered % self.sample_every:
                return
        rolling = sustained(values, self.window)
        if sketches is None:
            sketches = _ModelSketches(
                lows=HistogramQuantileSketch(half_life=self.half_life_requests),
                highs=HistogramQuantileSketch(half_life=self.half_life_requests),
            )
            self.state.models[key] = sketches
        sketches.lows.add(float(rolling.min()))
        sketches.highs.add(float(rolling.max()))


__all__ = ["Band", "BandState", "EntropyBands", "sustained"]
