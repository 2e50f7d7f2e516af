"""Per-(model, route) bands of sustained entropy, learned only from traffic judged normal.

The static rules use one threshold for every model; these bands say what is normal for each:
``low`` is a low quantile of a request's lowest sustained entropy (the minimum of its rolling
median over ``window`` tokens) and ``high`` a high quantile of its highest sustained entropy (the
rolling median's maximum). Sustained, not single tokens, because normal text has short spikes and
dips: a name is a few uncertain tokens, an indentation a few certain ones.

Only requests the detector did not flag are learned (a burst of loops cannot widen the band that
should catch them), and a band is used after ``min_requests`` (tens, not hundreds: the quantile
sketch is exact to one 0.02-nat bin whatever the count). Before that the detector uses its
cold-start rules. State is plain msgspec structs; it lives in the worker's memory (one per
worker, relearned in tens of requests after a restart).
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
import numpy as np

from streams.entropy_baseline import HistogramQuantileSketch


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
    return np.median(np.lib.stride_tricks.sliding_window_view(values, window), axis=1)


class EntropyBands:
    """Learns and serves the per-(model, route) bands."""

    def __init__(self, window: int = 20, min_requests: int = 20, quantile_low: float = 0.02,
                 quantile_high: float = 0.98, half_life_requests: int = 50_000,
                 state: BandState | None = None) -> None:
        self.window = window
        self.min_requests = min_requests
        self.quantile_low = quantile_low
        self.quantile_high = quantile_high
        self.half_life_requests = half_life_requests
        self.state = state or BandState()

    @staticmethod
    def key(model: str, route: str) -> str:
        return f"{model}\x1f{route}"

    def band(self, model: str, route: str) -> Band | None:
        """The band of a (model, route), or None while it has seen fewer than ``min_requests``."""
        sketches = self.state.models.get(self.key(model, route))
        if sketches is None or sketches.lows.seen < self.min_requests:
            return None
        (low,) = sketches.lows.quantiles((self.quantile_low,))
        (high,) = sketches.highs.quantiles((self.quantile_high,))
        return Band(low=low, high=high, requests=sketches.lows.seen)

    def learn(self, model: str, route: str, values: np.ndarray) -> None:
        """Add one normal request (or chunk) to its (model, route)'s band."""
        if values.size == 0:
            return
        rolling = sustained(values, self.window)
        key = self.key(model, route)
        sketches = self.state.models.get(key)
        if sketches is None:
            sketches = _ModelSketches(
                lows=HistogramQuantileSketch(half_life=self.half_life_requests),
                highs=HistogramQuantileSketch(half_life=self.half_life_requests),
            )
            self.state.models[key] = sketches
        sketches.lows.add(float(rolling.min()))
        sketches.highs.add(float(rolling.max()))


__all__ = ["Band", "BandState", "EntropyBands", "sustained"]
