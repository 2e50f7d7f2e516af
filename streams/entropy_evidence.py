"""Whether a static entropy run is a real loop or real gibberish, and the evidence that says so.

The static rules (streams/entropy_anomaly.py) find runs of low or high entropy. On their own they
flag the normal text of a low-temperature code model as loops (it is nearly certain of most
tokens) and the normal spikes of a chatty or creative model as gibberish. This module judges each
static run before it becomes an alert:

- loop: the run must contain a periodic stretch (period <= ``loop_max_period``, repeated at least
  ``loop_min_repeats`` times over ``loop_min_tokens`` tokens): of the sampled token ids when the
  record carries them, else of the entropy sequence (with more tokens required, and, once the
  (model, route) has a band, a stretch below the model's own lowest sustained entropy); with token
  ids, a stretch that keeps copying earlier text with small changes (a near-cycle,
  ``streams/template_repeats.py``) counts too;
- gibberish: the sustained entropy (rolling median over the band window) around the run must exceed
  an absolute floor (``gibberish_floor_nats``: near-uniform sampling, a level no healthy model
  sustains) and, once the band exists, the model's own band (its high edge plus a margin), so a
  model that normally runs hot is not gibberish.

The evidence that fired (rule, repetition period and repeats, band, level) is returned as a dict
that the detector writes, as JSON, into the alert's ``baseline`` field.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from entroloop.streams.entropy_bands import EntropyBands, sustained
from entroloop.streams.periodicity import (
    Stretch,
    autocorrelation,
    find_entropy_period,
    find_id_period,
)
from entroloop.streams.template_repeats import TemplateRepeat, template_repeat

from entroloop.contract.records import Alert, Event
from entroloop.contract.settings import Settings

LOOP_RULE = "repetition_loop"
"""entroloop.streams.entropy_anomaly.LOOP (not imported from there: that module imports this one)."""


@dataclass(frozen=True)
class EvidenceConfig:
    """The evidence thresholds (``Settings`` documents each)."""

    loop_max_period: int = 48
    loop_min_repeats: float = 3.0
    loop_min_tokens: int = 16
    loop_min_tokens_entropy_only: int = 24
    loop_entropy_tolerance_nats: float = 0.08
    loop_entropy_tolerance_relative: float = 0.15
    band_margin_nats: float = 0.5
    gibberish_floor_nats: float = 6.5
    loop_entropy_min_spread_nats: float = 0.5
    loop_entropy_repeat_tolerance_nats: float = 0.25
    surprisal_window: int = 32
    surprisal_excess_nats: float = 1.85
    sampling_window: int = 32
    sampling_excess_nats: float = 0.95
    loop_template_ngram: int = 4
    loop_template_lookback: int = 160
    loop_template_share: float = 0.9

    @classmethod
    def from_settings(cls, settings: Settings) -> EvidenceConfig:
        return cls(
            loop_max_period=settings.loop_max_period,
            loop_min_repeats=settings.loop_min_repeats,
            loop_min_tokens=settings.loop_min_tokens,
            loop_min_tokens_entropy_only=settings.loop_min_tokens_entropy_only,
            loop_entropy_tolerance_nats=settings.loop_entropy_tolerance_nats,
            loop_entropy_tolerance_relative=settings.loop_entropy_tolerance_relative,
            band_margin_nats=settings.entropy_band_margin_nats,
            gibberish_floor_nats=settings.gibberish_floor_nats,
            loop_entropy_min_spread_nats=settings.loop_entropy_min_spread_nats,
            loop_entropy_repeat_tolerance_nats=settings.loop_entropy_repeat_tolerance_nats,
            surprisal_window=settings.gibberish_surprisal_window,
            surprisal_excess_nats=settings.gibberish_surprisal_excess_nats,
            sampling_window=settings.gibberish_sampling_window,
            sampling_excess_nats=settings.gibberish_sampling_excess_nats,
            loop_template_ngram=settings.loop_template_ngram,
            loop_template_lookback=settings.loop_template_lookback,
            loop_template_share=settings.loop_template_share,
        )


class EntropyEvidence:
    """Judges static runs against repetition and the per-(model, route) bands."""

    def __init__(self, config: EvidenceConfig | None = None, bands: EntropyBands | None = None) -> None:
        self.config = config or EvidenceConfig()
        self.bands = bands or EntropyBands()

    @classmethod
    def from_settings(cls, settings: Settings) -> EntropyEvidence:
        return cls(
            EvidenceConfig.from_settings(settings),
            EntropyBands(window=settings.entropy_band_window, min_requests=settings.entropy_band_min_requests),
        )

    def judge_loop(self, model: str, route: str, values: np.ndarray, hashes: np.ndarray | None,
                   start: int, end: int, offset: int) -> dict[str, Any] | None:
        """Evidence that ``values[start:end]`` (chunk coordinates) holds a loop, or None."""
        c = self.config
        if end - start < min(c.loop_min_tokens, c.loop_min_tokens_entropy_only):
            return None  # most static runs (a few certain tokens) end here, before any array work
        band = self.bands.band(model, route)
        run = values[start:end].astype(np.float32)
        if hashes is not None:
            found = find_id_period(hashes[start:end], run, c.loop_max_period, c.loop_min_repeats, c.loop_min_tokens)
        else:
            found = find_entropy_period(run, c.loop_max_period, c.loop_min_repeats, c.loop_min_tokens_entropy_only,
                                        c.loop_entropy_tolerance_nats, c.loop_entropy_tolerance_relative)
        if found is None:
            return None
        mean = float(run[found.start:found.end].mean())
        return {
            "evidence": "token_ids" if found.source == "token_ids" else "entropy_periodicity",
            "period": found.period,
            "repeats": round(found.repeats, 1),
            "stretch": [offset + start + found.start, offset + start + found.end],
            "stretch_mean": round(mean, 3),
            "autocorrelation": round(found.autocorrelation, 3),
            "band": band.as_dict() if band is not None else None,
        }

    def near_cycle(self, ids: np.ndarray) -> TemplateRepeat | None:
        """The longest stretch of ``ids`` that keeps copying earlier text with changes (a loop with no
        exact period), or None."""
        c = self.config
        return template_repeat(ids, c.loop_template_ngram, c.loop_template_lookback, c.loop_template_share,
                               c.loop_min_repeats, c.loop_min_tokens)

    def periodic_loop(self, model: str, route: str, values: np.ndarray, stretch: Stretch, offset: int,
                      source: str) -> dict[str, Any]:
        """The evidence of a loop found by periodicity alone (no low-entropy run nominated it):
        ``stretch`` repeats its token ids (``source`` "token_ids") or its entropy sequence
        ("entropy_periodicity")."""
        run = values[stretch.start:stretch.end].astype(np.float32)
        band = self.bands.band(model, route)
        return {
            "evidence": source,
            "period": stretch.period,
            "repeats": round(stretch.length / stretch.period, 1),
            "stretch": [offset + stretch.start, offset + stretch.end],
            "stretch_mean": round(float(run.mean()), 3),
            "autocorrelation": round(autocorrelation(run, stretch.period), 3),
            "band": band.as_dict() if band is not None else None,
        }

    def judge_gibberish(self, model: str, route: str, values: np.ndarray, start: int, end: int,
                        static_threshold: float) -> dict[str, Any] | None:
        """Evidence that the high run ``values[start:end]`` is gibberish, or None (a normal spike)."""
        c = self.config
        window = self.bands.window
        band = self.bands.band(model, route)
        # Gibberish is near-uniform sampling: a sustained level no healthy model holds (the floor),
        # and above this model's own band, so a model that normally runs hot is judged by its band.
        edge = max(static_threshold, c.gibberish_floor_nats)
        if band is not None:
            edge = max(edge, band.high + c.band_margin_nats)
        # Only the windows that overlap the run matter; a window's median is above the edge only if
        # about half its tokens are, so a short spike is rejected before any median is taken.
        if values.size <= window:
            near = values
        else:
            near = values[max(0, start - window + 1):min(values.size, end + window - 1)]
        if int((near > edge).sum()) < min(window, near.size) // 2:
            return None
        level = float(sustained(near, window).max())
        if level <= edge:
            return None
        return {
            "evidence": "sustained_level" if band is None else "above_band",
            "level": round(level, 3),
            "edge": round(edge, 3),
            "window": window,
            "band": band.as_dict() if band is not None else None,
        }

    def judge_surprisal(self, model: str, route: str, values: np.ndarray, surprisals: np.ndarray,
                        offset: int) -> tuple[int, int, dict[str, Any]] | None:
        """Gibberish from the sampled tokens' surprisal, whatever the entropy level: (start, end,
        evidence) of the stretch where the rolling median of ``surprisal - entropy`` exceeds
        ``surprisal_excess_nats``, or None.

        Entropy is the surprisal the model expects; a model sampled as it would sample itself
        (temperature 1) has a median excess just below 0, a cooler one a negative excess. Tokens
        that keep surprising the model by nats more than it expected are being drawn from a far
        flatter distribution than its own (high temperature, broken sampling): gibberish, even when
        the model's own entropy, measured before temperature, is ordinary."""
        c = self.config
        return self._judge_excess("surprisal", model, route, values, surprisals, offset,
                                  c.surprisal_window, c.surprisal_excess_nats)

    def judge_sampling(self, model: str, route: str, values: np.ndarray, sampling: np.ndarray,
                       offset: int) -> tuple[int, int, dict[str, Any]] | None:
        """Gibberish from the entropy at the sampling temperature, without token ids: as
        ``judge_surprisal`` with ``sampling entropy - entropy`` (0 at temperature 1, negative below
        it) against ``sampling_excess_nats``. The distribution the tokens are drawn from is that many
        nats flatter than the model's own, token after token: the sampler, not the model, writes."""
        c = self.config
        return self._judge_excess("sampling_entropy", model, route, values, sampling, offset,
                                  c.sampling_window, c.sampling_excess_nats)

    def _judge_excess(self, kind: str, model: str, route: str, values: np.ndarray, other: np.ndarray,
                      offset: int, window: int, edge: float) -> tuple[int, int, dict[str, Any]] | None:
        excess = other.astype(np.float32) - values.astype(np.float32)
        rolled = sustained(excess, window)
        above = np.flatnonzero(rolled > edge)
        if above.size == 0:
            return None
        # A window's median is over the edge once more than half its tokens are: the stretch runs
        # from the centre of the first such window to the centre of the last.
        if values.size <= window:
            start, end = 0, int(values.size)
        else:
            half = window // 2
            start, end = int(above[0]) + half, int(above[-1]) + half + 1
        band = self.bands.band(model, route)
        return start, end, {
            "evidence": kind,
            "level": round(float(rolled.max()), 3),
            "edge": edge,
            "window": window,
            "stretch": [offset + start, offset + end],
            f"stretch_{kind}": round(float(other[start:end].astype(np.float32).mean()), 3),
            "stretch_entropy": round(float(values[start:end].astype(np.float32).mean()), 3),
            "band": band.as_dict() if band is not None else None,
        }

    def learn_if_normal(self, model: str, route: str, values: np.ndarray, alerts: Sequence[Event]) -> None:
        """Add a judged request (chunk) to its model's band: once the band exists only when nothing
        was flagged; during warm-up unless a loop was confirmed (see streams/entropy_bands.py)."""
        if not alerts or (not self.bands.warm(model, route) and not any(isinstance(a, Alert) and a.rule == LOOP_RULE for a in alerts)):
            self.bands.learn(model, route, values)


__all__ = ["EntropyEvidence", "EvidenceConfig"]
