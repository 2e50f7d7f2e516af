"""Entropy anomalies: repetition loops (long runs of very low entropy) and gibberish (runs of very
high entropy) in one request's per-token entropies.

A model stuck in a loop is nearly certain of every next token, so entropy stays far below its
normal band; a model emitting gibberish is nearly uniform over many tokens. One isolated token of
either kind is normal (a forced closing bracket, a name), so a rule needs a *run* of
``min_run`` consecutive tokens. Long generations arrive in chunks; an open run at the end of a
non-final chunk is carried to the next chunk so a loop spanning the boundary is one alert.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from entroloop.codec import encode
from entroloop.records import Alert, DeadLetter, Event, TokenEntropy
from entroloop.topics import partition_for
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
        incomplete_ttl_s: float = 600.0,
    ) -> None:
        self.rules = (
            RunRule(LOOP, loop_threshold, loop_min_run, below=True),
            RunRule(GIBBERISH, gibberish_threshold, gibberish_min_run, below=False),
        )
        # (request_id, rule name) -> run open at the end of the previous chunk
        self._open: dict[tuple[str, str], _OpenRun] = {}
        # request_id -> its latest non-final chunk: a request whose final chunk never comes
        # becomes a dead letter once event time is incomplete_ttl_s past that chunk
        self.incomplete_ttl_s = incomplete_ttl_s
        self._unfinished: dict[str, TokenEntropy] = {}

    def process(self, record: Event) -> list[Event]:
        return self.process_batch([record])

    def process_batch(self, records: Sequence[Event]) -> list[Event]:
        """Find runs for a whole micro-batch in a few vectorised passes over all its tokens.

        Per-record numpy calls cost more than the arithmetic at typical lengths, so the batch's
        entropies are concatenated and runs are found once, never crossing a record's edge.
        """
        if not records:
            return []
        arrays = [r.values() for r in records]  # type: ignore[attr-defined]
        bounds = np.zeros(len(arrays) + 1, dtype=np.int64)
        np.cumsum([a.size for a in arrays], out=bounds[1:])
        flat = np.concatenate(arrays).astype(np.float32)
        sums = np.concatenate(([0.0], np.cumsum(flat, dtype=np.float64)))
        per_record: list[dict[str, list[tuple[int, int, float]]]] = [{} for _ in records]
        for rule in self.rules:
            for i, start, end in self._candidate_runs(rule, flat, bounds):
                base = bounds[i]
                per_record[i].setdefault(rule.name, []).append(
                    (int(start - base), int(end - base), float(sums[end] - sums[start]))
                )
        alerts: list[Event] = []
        for record, runs in zip(records, per_record):
            if record.final:  # type: ignore[attr-defined]
                self._unfinished.pop(record.request_id, None)
            else:
                self._unfinished[record.request_id] = record  # type: ignore[assignment]
            found: list[Event] = []
            for rule in self.rules:
                for start, end, total in self._close_runs(record, rule, runs.get(rule.name, [])):
                    if end - start >= rule.min_run:
                        found.append(self._alert(record, rule, start, end, total / (end - start), len(found)))
            alerts.extend(found)
        return alerts

    @staticmethod
    def _candidate_runs(rule: RunRule, flat: np.ndarray, bounds: np.ndarray) -> list[tuple[int, int, int]]:
        """(record index, start, end) in batch coordinates of runs that can matter: long enough,
        or touching a record edge (a chunked generation may continue them)."""
        mask = rule.mask(flat)
        if not mask.any():
            return []
        first, last = bounds[:-1], bounds[1:] - 1
        nonempty = bounds[1:] > bounds[:-1]
        starts_mask = mask.copy()
        starts_mask[1:] &= ~mask[:-1]
        starts_mask[first[nonempty]] = mask[first[nonempty]]
        ends_mask = mask.copy()
        ends_mask[:-1] &= ~mask[1:]
        ends_mask[last[nonempty]] = mask[last[nonempty]]
        starts = np.flatnonzero(starts_mask)
        ends = np.flatnonzero(ends_mask) + 1
        index = np.searchsorted(bounds, starts, side="right") - 1
        keep = (ends - starts >= rule.min_run) | (starts == bounds[index]) | (ends == bounds[index + 1])
        return list(zip(index[keep].tolist(), starts[keep].tolist(), ends[keep].tolist()))

    def _close_runs(self, record: Event, rule: RunRule, runs: list[tuple[int, int, float]]) -> list[tuple[int, int, float]]:
        """Absolute [start, end) runs closed by this chunk, joining a run carried from the last one."""
        assert isinstance(record, TokenEntropy)
        n = record.n_tokens
        key = (record.request_id, rule.name)
        carried = self._open.pop(key, None)
        if carried is not None and carried.next_chunk != record.chunk_index:
            carried = None  # out-of-order chunk: judge it on its own rather than join wrong tokens
        offset = record.first_token_index
        closed: list[tuple[int, int, float]] = []
        for i, (start, end, total) in enumerate(runs):
            abs_start, abs_end = offset + start, offset + end
            if i == 0 and start == 0 and carried is not None:
                abs_start, total = carried.start, total + carried.total
                carried = None
            if end == n and not record.final:
                self._open[key] = _OpenRun(record.chunk_index + 1, abs_start, abs_end - abs_start, total)
                continue
            closed.append((abs_start, abs_end, total))
        if carried is not None:  # the carried run ended exactly at the previous chunk boundary
            closed.insert(0, (carried.start, carried.start + carried.length, carried.total))
        return closed

    def on_watermark(self, event_time: float) -> list[Event]:
        """Requests whose final chunk has not come within the TTL: a dead letter each, state dropped."""
        expired = [r for r in self._unfinished.values() if r.emitted_at + self.incomplete_ttl_s < event_time]
        out: list[Event] = []
        for last in expired:
            del self._unfinished[last.request_id]
            for rule in self.rules:
                self._open.pop((last.request_id, rule.name), None)
            payload = encode(last)
            out.append(derive(
                last, DeadLetter, 0, f"{self.name}.incomplete",
                source_topic=TokenEntropy.topic,
                source_partition=partition_for(last.request_id),
                source_offset=0,
                reason=f"request {last.request_id} never completed: chunk {last.chunk_index} "
                f"(tokens {last.first_token_index}..{last.first_token_index + last.n_tokens}) was the last, "
                f"no final chunk within {self.incomplete_ttl_s:.0f} s (source offset unknown to the processor)",
                error_type="incomplete_request",
                payload=payload[:4096],
                payload_size=len(payload),
            ))
        return out

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
