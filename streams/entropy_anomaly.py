"""Entropy anomalies: repetition loops (long runs of very low entropy) and gibberish (runs of very
high entropy) in one request's per-token entropies.

A model stuck in a loop is nearly certain of every next token, so entropy stays far below its
normal band; a model emitting gibberish is nearly uniform over many tokens. One isolated token of
either kind is normal (a forced closing bracket, a name), so a rule needs a *run* of
``min_run`` consecutive tokens. Long generations arrive in chunks; an open run at the end of a
non-final chunk is carried to the next chunk so a loop spanning the boundary is one alert.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from entroloop.records import Alert, Event, TokenEntropy
from streams.base import Processor, derive

LOOP = "repetition_loop"
GIBBERISH = "gibberish"


@dataclass(frozen=True)
class RunRule:
    name: str
    threshold: float
    min_run: int
    below: bool
    """True: tokens strictly below the threshold count; False: tokens strictly above it."""

    def mask(self, values: np.ndarray) -> np.ndarray:
        return values < self.threshold if self.below else values > self.threshold


def find_runs(mask: np.ndarray) -> list[tuple[int, int]]:
    """Half-open [start, end) index pairs of the runs of True in ``mask``."""
    if not mask.size:
        return []
    padded = np.concatenate(([False], mask, [False])).astype(np.int8)
    edges = np.flatnonzero(np.diff(padded))
    return list(zip(edges[0::2].tolist(), edges[1::2].tolist()))


@dataclass
class _OpenRun:
    """A run still open at the end of a non-final chunk: absolute start, length and value sum."""

    next_chunk: int
    start: int
    length: int
    total: float


class EntropyAnomalyDetector(Processor):
    """Emits one ``Alert`` per loop or gibberish run of at least ``min_run`` tokens."""

    name = "entropy_anomaly"
    inputs = (TokenEntropy,)

    def __init__(
        self,
        loop_threshold: float = 1.5,
        loop_min_run: int = 5,
        gibberish_threshold: float = 4.5,
        gibberish_min_run: int = 5,
    ) -> None:
        self.rules = (
            RunRule(LOOP, loop_threshold, loop_min_run, below=True),
            RunRule(GIBBERISH, gibberish_threshold, gibberish_min_run, below=False),
        )
        # (request_id, rule name) -> run open at the end of the previous chunk
        self._open: dict[tuple[str, str], _OpenRun] = {}

    def process(self, record: Event) -> list[Event]:
        assert isinstance(record, TokenEntropy)
        values = record.values().astype(np.float32)
        alerts: list[Event] = []
        for rule in self.rules:
            for start, end, total in self._runs(record, rule, values):
                if end - start >= rule.min_run:
                    alerts.append(self._alert(record, rule, start, end, total / (end - start), len(alerts)))
        return alerts

    def _runs(self, record: TokenEntropy, rule: RunRule, values: np.ndarray) -> list[tuple[int, int, float]]:
        """Absolute [start, end) runs closed by this chunk, with the sum of their values."""
        key = (record.request_id, rule.name)
        carried = self._open.pop(key, None)
        if carried is not None and carried.next_chunk != record.chunk_index:
            carried = None  # out-of-order chunk: judge it on its own rather than join wrong tokens
        offset = record.first_token_index
        closed: list[tuple[int, int, float]] = []
        runs = find_runs(rule.mask(values))
        for i, (start, end) in enumerate(runs):
            total = float(values[start:end].sum())
            abs_start, abs_end = offset + start, offset + end
            if i == 0 and start == 0 and carried is not None:
                abs_start, total = carried.start, total + carried.total
                carried = None
            if end == len(values) and not record.final:
                self._open[key] = _OpenRun(record.chunk_index + 1, abs_start, abs_end - abs_start, total)
                continue
            closed.append((abs_start, abs_end, total))
        if carried is not None:  # the carried run ended exactly at the previous chunk boundary
            closed.insert(0, (carried.start, carried.start + carried.length, carried.total))
        return closed

    def _alert(self, record: TokenEntropy, rule: RunRule, start: int, end: int, mean: float, index: int) -> Alert:
        return derive(
            record,
            Alert,
            index,
            self.name,
            alert_key=f"{rule.name}:{record.request_id}:{start}",
            rule=rule.name,
            severity="warning",
            model=record.model,
            route=record.route,
            subject_node=record.node_id,
            token_start=start,
            token_end=end,
            value=round(mean, 4),
            threshold=rule.threshold,
            baseline=f"static:{'<' if rule.below else '>'}{rule.threshold}x{rule.min_run}",
            detail=f"{end - start} consecutive tokens {'below' if rule.below else 'above'} "
            f"{rule.threshold} nats (mean {mean:.2f})",
            source_event_id=record.event_id,
        )
