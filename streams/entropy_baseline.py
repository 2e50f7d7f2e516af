"""Per-model adaptive entropy baselines: judge each model against its own normal band.

The static loop/gibberish rules (streams/entropy_anomaly.py) use one threshold for every model,
but a small distilled model normally runs hotter than a large one, and a route with JSON output
runs colder than a chat route. This detector learns, per (model, route), the distribution of a
request's *mean* token entropy with a streaming quantile sketch and alerts when a request falls
outside the learned ``[q_low, q_high]`` band (plus a margin), carrying the band in ``baseline``.

The sketch is a fixed-bin histogram over ``[0, max_nats)``: O(1) update, quantiles exact to one
bin (0.02 nats by default, far below any useful alert margin), mergeable across workers by
adding counts, and plain lists of floats so its state encodes with msgspec (a Faust table can
hold it). It forgets exponentially (counts halve every ``half_life`` requests) so the band follows
slow drift, e.g. after an adapter promotion, while one burst cannot move it.
"""

from __future__ import annotations

import json
import math
from bisect import bisect_left
from collections.abc import Sequence
from itertools import accumulate

import msgspec
import numpy as np
from entroloop.streams.base import Processor, derive

from entroloop.contract.records import Alert, Event, TokenEntropy
from entroloop.contract.settings import Settings

RULE = "entropy_baseline_shift"


class HistogramQuantileSketch(msgspec.Struct):
    """Fixed-bin histogram over ``[0, max_value)`` with exponential forgetting.

    Values at or above ``max_value`` land in the last bin (entropy is bounded by ln(vocab size),
    about 12 nats for a 150k vocabulary, so the default 16 nats loses nothing).
    """

    bin_width: float = 0.02
    max_value: float = 16.0
    half_life: int = 50_000
    counts: list[float] = []
    total: float = 0.0
    seen: int = 0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0.0] * int(math.ceil(self.max_value / self.bin_width))

    def add(self, value: float) -> None:
        index = int(value / self.bin_width)
        if index >= len(self.counts):
            index = len(self.counts) - 1
        elif index < 0:
            index = 0
        self.counts[index] += 1.0
        self.total += 1.0
        self.seen += 1
        # Halving every half_life requests is exponential forgetting done in O(bins) once per
        # half_life updates instead of O(1) multiplications on every update.
        if self.seen % self.half_life == 0:
            self.counts = [c * 0.5 for c in self.counts]
            self.total *= 0.5

    def quantiles(self, qs: Sequence[float]) -> list[float]:
        """Quantiles by linear interpolation inside the bin where the cumulative weight crosses q."""
        if self.total <= 0:
            return [math.nan for _ in qs]
        # The same running sums as np.cumsum, without turning ~800 Python floats into an array
        # first (two thirds of the call's time: bands recompute their quantiles while they learn).
        cumulative = list(accumulate(self.counts))
        out = []
        for q in qs:
            target = q * self.total
            index = bisect_left(cumulative, target)  # np.searchsorted(..., side="left")
            index = min(index, len(self.counts) - 1)
            before = cumulative[index - 1] if index else 0.0
            weight = self.counts[index]
            fraction = (target - before) / weight if weight > 0 else 0.0
            out.append(float((index + min(max(fraction, 0.0), 1.0)) * self.bin_width))
        return out

    def merge(self, other: HistogramQuantileSketch) -> None:
        """Add another worker's sketch of the same bins (partitions of one model)."""
        if len(other.counts) != len(self.counts) or other.bin_width != self.bin_width:
            raise ValueError("can only merge sketches with identical bins")
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        self.total += other.total
        self.seen += other.seen


class _Band(msgspec.Struct):
    """The cached band of one (model, route): recomputing quantiles on every request is wasteful."""

    low: float
    median: float
    high: float
    at_seen: int


class BaselineState(msgspec.Struct):
    """Everything the detector remembers; msgspec-encodable for a changelogged table."""

    sketches: dict[str, HistogramQuantileSketch] = {}
    # request_id -> [sum of entropies, token count, first token index] for chunked generations.
    partial: dict[str, list[float]] = {}
    partial_seen_at: dict[str, float] = {}


class EntropyBaselineDetector(Processor):
    """Alert when a request's mean entropy leaves its (model, route)'s own learned band.

    Input: ``TokenEntropy`` (chunks of one request are summed until ``final``).
    Output: ``Alert`` with ``rule="entropy_baseline_shift"``, ``token_start``/``token_end`` the
    request's token span, ``value`` the mean entropy, ``threshold`` the band edge crossed, and
    ``baseline`` a JSON object ``{"q_low", "p50", "q_high", "n", "quantiles"}``.
    """

    name = "entropy_baseline"
    inputs = (TokenEntropy,)

    def __init__(
        self,
        quantile_low: float = 0.01,
        quantile_high: float = 0.99,
        min_samples: int = 200,
        margin_nats: float = 0.1,
        half_life_requests: int = 50_000,
        refresh_every: int = 64,
        partial_ttl_s: float = 600.0,
        state: BaselineState | None = None,
    ) -> None:
        if not 0 < quantile_low < quantile_high < 1:
            raise ValueError("need 0 < quantile_low < quantile_high < 1")
        self.quantile_low = quantile_low
        self.quantile_high = quantile_high
        self.min_samples = min_samples
        self.margin_nats = margin_nats
        self.half_life_requests = half_life_requests
        self.refresh_every = refresh_every
        self.partial_ttl_s = partial_ttl_s
        self.state = state or BaselineState()
        self._bands: dict[str, _Band] = {}

    @classmethod
    def from_settings(cls, settings: Settings) -> EntropyBaselineDetector:
        return cls(
            quantile_low=settings.baseline_quantile_low,
            quantile_high=settings.baseline_quantile_high,
            min_samples=settings.baseline_min_samples,
            margin_nats=settings.baseline_margin_nats,
            half_life_requests=settings.baseline_half_life_requests,
        )

    def band(self, model: str, route: str = "default") -> tuple[float, float, float] | None:
        """The current (q_low, median, q_high) of a (model, route), or None before min_samples."""
        key = f"{model}\x1f{route}"
        sketch = self.state.sketches.get(key)
        if sketch is None or sketch.seen < self.min_samples:
            return None
        band = self._band(key, sketch)
        return band.low, band.median, band.high

    def _band(self, key: str, sketch: HistogramQuantileSketch) -> _Band:
        band = self._bands.get(key)
        if band is None or sketch.seen - band.at_seen >= self.refresh_every:
            low, median, high = sketch.quantiles((self.quantile_low, 0.5, self.quantile_high))
            band = _Band(low=low, median=median, high=high, at_seen=sketch.seen)
            self._bands[key] = band
        return band

    def process(self, record: Event) -> list[Event]:
        if not isinstance(record, TokenEntropy):
            return []
        values = record.values()
        total = float(np.add.reduce(values, dtype=np.float32))  # float32: exact enough, no wrapper cost
        count = values.size
        first = record.first_token_index
        if not record.final or record.request_id in self.state.partial:
            acc = self.state.partial.setdefault(record.request_id, [0.0, 0.0, float(first)])
            acc[0] += total
            acc[1] += count
            acc[2] = min(acc[2], float(first))
            self.state.partial_seen_at[record.request_id] = record.emitted_at
            if not record.final:
                return []
            total, count, first_f = self.state.partial.pop(record.request_id)
            self.state.partial_seen_at.pop(record.request_id, None)
            count = int(count)
            first = int(first_f)
        if count == 0:
            return []
        mean = total / count
        key = f"{record.model}\x1f{record.route}"
        sketch = self.state.sketches.get(key)
        if sketch is None:
            sketch = HistogramQuantileSketch(half_life=self.half_life_requests)
            self.state.sketches[key] = sketch
        out: list[Event] = []
        # Judge before learning, so the request under test is not part of its own baseline.
        if sketch.seen >= self.min_samples:
            band = self._band(key, sketch)
            edge, direction = None, ""
            if mean < band.low - self.margin_nats:
                edge, direction = band.low, "below"
            elif mean > band.high + self.margin_nats:
                edge, direction = band.high, "above"
            if edge is not None:
                baseline = json.dumps(
                    {
                        "q_low": round(band.low, 4),
                        "p50": round(band.median, 4),
                        "q_high": round(band.high, 4),
                        "n": sketch.seen,
                        "quantiles": [self.quantile_low, 0.5, self.quantile_high],
                    },
                    separators=(",", ":"),
                )
                out.append(
                    derive(
                        record,
                        Alert,
                        0,
                        self.name,
                        alert_key=f"{RULE}:{record.request_id}",
                        rule=RULE,
                        severity="warning",
                        model=record.model,
                        route=record.route,
                        subject_node=record.node_id,
                        token_start=first,
                        token_end=first + count,
                        value=mean,
                        threshold=edge,
                        baseline=baseline,
                        detail=f"mean entropy {mean:.3f} nats {direction} the model's own band "
                        f"[{band.low:.3f}, {band.high:.3f}] (margin {self.margin_nats})",
                        source_event_id=record.event_id,
                    )
                )
        # Learning every request (anomalies too) lets a lasting shift become the new normal after
        # about one half-life, while alerts fire in the meantime.
        sketch.add(mean)
        return out

    def on_watermark(self, event_time: float) -> list[Event]:
        """Drop chunk accumulators of requests whose final chunk never came."""
        stale = [r for r, t in self.state.partial_seen_at.items() if t < event_time - self.partial_ttl_s]
        for request_id in stale:
            self.state.partial.pop(request_id, None)
            self.state.partial_seen_at.pop(request_id, None)
        return []


__all__ = ["EntropyBaselineDetector", "HistogramQuantileSketch", "BaselineState", "RULE"]
