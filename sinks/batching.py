"""Bounded batching in front of a sink: few, large, idempotent inserts and explicit backpressure.

A Kafka sink consumer hands every polled message range to ``SinkBatcher.add`` and calls
``SinkBatcher.flush_due`` from its poll loop. One batcher serves every partition the consumer owns:
a topic's buffered rows, from all its partitions, become one insert when they reach ``max_rows``
or when the oldest has waited ``max_seconds`` (about one insert per second per table under load:
the figure ClickHouse is built for, instead of many small parts). The wait is counted from when
the oldest row was appended to Kafka (``add(..., appended_at=...)``, the broker timestamp), not
from when the sink took it, so time spent in Kafka counts against the bound. The offsets a flush
returns are the ones the consumer may commit, and only those: they are durable.

Memory is bounded by ``max_buffered_rows``. Past it, ``add`` refuses the records with
``SinkBackpressure`` *before* taking them; the consumer pauses its partitions, keeps polling (so
the group does not rebalance) and calling ``flush_due``, and resumes when ``has_room`` is true.
A failing write (ClickHouse down) keeps its rows and is retried with exponential backoff, so a
long outage turns into backpressure, never into unbounded memory or lost rows.

Cuts are made at multiples of ``max_rows`` in each partition's offsets, so under load (where
row bounds, not the clock, close batches) a redelivery after a crash re-cuts the same ranges and
their deduplication tokens repeat. A time-closed batch can be re-cut differently after a crash;
the tables' ReplacingMergeTree on ``event_id`` keeps raw rows exact in that case.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol


class SinkBackpressure(Exception):
    """The batcher is full: pause consumption, keep calling ``flush_due``, retry when it has room."""

    def __init__(self, topic: str, partition: int, buffered_rows: int, limit: int, last_error: str = "") -> None:
        self.topic = topic
        self.partition = partition
        self.buffered_rows = buffered_rows
        self.limit = limit
        self.last_error = last_error
        detail = f"; last write error: {last_error}" if last_error else ""
        super().__init__(f"sink buffer full ({buffered_rows}/{limit} rows) at {topic}[{partition}]{detail}")


@dataclass(frozen=True)
class Slice:
    """Records read from one partition, offsets ``first..last`` inclusive."""

    partition: int
    first: int
    last: int
    records: Sequence[Any]


class BatchTarget(Protocol):
    """``write`` (one partition's slice), or ``write_slices(topic, slices)`` (a topic's whole cut);
    optionally ``prepare(cuts)``, called once with every due topic's cut before any is written."""

    def write(self, topic: str, partition: int, first_offset: int, last_offset: int, records: Sequence[Any]) -> int: ...


@dataclass
class _PartitionBuffer:
    first: int = -1
    last: int = -1
    records: list[Any] = field(default_factory=list)


@dataclass
class _TopicBuffer:
    partitions: dict[int, _PartitionBuffer] = field(default_factory=dict)
    rows: int = 0
    oldest: float = 0.0
    retry_at: float = 0.0
    failures: int = 0
    retry_cut: list[Slice] | None = None  # a failed write is retried with the same cut, not a longer one


class SinkBatcher:
    """Buffers record ranges per topic and partition; writes each topic as one insert when due."""

    def __init__(
        self,
        target: BatchTarget,
        max_rows: int = 50_000,
        max_seconds: float = 1.0,
        max_buffered_rows: int = 500_000,
        max_backoff_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if max_buffered_rows < max_rows:
            raise ValueError("max_buffered_rows must be at least max_rows")
        self.target = target
        self.max_rows = max_rows
        self.max_seconds = max_seconds
        self.max_buffered_rows = max_buffered_rows
        self.max_backoff_s = max_backoff_s
        self.clock = clock
        self._topics: dict[str, _TopicBuffer] = {}
        self.buffered_rows = 0
        self.inserts = 0
        self.rows_written = 0
        self.write_errors = 0
        self.last_error = ""

    # --- taking records --------------------------------------------------------------------------
    def has_room(self, rows: int = 1) -> bool:
        return self.buffered_rows + rows <= self.max_buffered_rows

    def partition_rows(self, topic: str, partition: int) -> int:
        """Rows of one partition buffered and not yet written."""
        buf = self._topics.get(topic)
        part = buf.partitions.get(partition) if buf else None
        return len(part.records) if part else 0

    def add(self, topic: str, partition: int, first_offset: int, last_offset: int, records: Sequence[Any],
            appended_at: float | None = None) -> None:
        """Buffer ``records`` read at offsets ``first_offset..last_offset`` of ``topic``/``partition``.

        ``appended_at`` (wall-clock seconds, e.g. the oldest record's broker timestamp) starts the
        batch's clock when the records entered Kafka; without it the clock starts now. A timestamp
        in the future (a broker clock ahead of this host) counts as now.

        Raises ``SinkBackpressure`` (taking nothing) when they do not fit; offsets must continue
        where the partition's buffered range ends (a consumer re-seeks after a rebalance, which
        calls ``drop_partition`` first).
        """
        if not self.has_room(len(records)):
            raise SinkBackpressure(topic, partition, self.buffered_rows, self.max_buffered_rows, self.last_error)
        buf = self._topics.setdefault(topic, _TopicBuffer())
        part = buf.partitions.setdefault(partition, _PartitionBuffer())
        if part.records and first_offset != part.last + 1:
            raise ValueError(f"{topic}[{partition}]: offset {first_offset} does not follow buffered {part.last}")
        if not part.records:
            part.first = first_offset
        part.last = last_offset
        part.records.extend(records)
        now = self.clock()
        started = now if appended_at is None else now - max(0.0, time.time() - appended_at)
        buf.oldest = started if buf.rows == 0 else min(buf.oldest, started)
        buf.rows += len(records)
        self.buffered_rows += len(records)

    def next_due_in(self) -> float:
        """Seconds until the next topic is due by time (``inf`` with nothing buffered)."""
        now = self.clock()
        waits = [max(buf.oldest + self.max_seconds, buf.retry_at) - now for buf in self._topics.values() if buf.rows]
        return min(waits, default=float("inf"))

    def drop_partition(self, topic: str, partition: int) -> int:
        """Forget a revoked partition's unwritten rows (the new owner re-reads them); count dropped."""
        buf = self._topics.get(topic)
        part = buf.partitions.pop(partition, None) if buf else None
        if not part:
            return 0
        buf.retry_cut = None
        buf.rows -= len(part.records)
        self.buffered_rows -= len(part.records)
        return len(part.records)

    # --- writing ---------------------------------------------------------------------------------
    def flush_due(self, force: bool = False) -> list[tuple[str, int, int]]:
        """Write every topic whose batch is due; return ``(topic, partition, next_offset)`` to commit."""
        now = self.clock()
        committed: list[tuple[str, int, int]] = []
        due = {topic: buf for topic, buf in self._topics.items()
               if buf.rows and (force or now >= buf.retry_at)
               and (force or buf.rows >= self.max_rows or now - buf.oldest >= self.max_seconds)}
        if not due:
            return committed
        cuts = {topic: buf.retry_cut or self._cut(topic, buf) for topic, buf in due.items()}
        prepare = getattr(self.target, "prepare", None)
        if prepare is not None:
            # one step ahead of all the writes of this flush (the Kafka sink journals them in one commit)
            try:
                prepare(cuts)
            except Exception as exc:  # noqa: BLE001 - like a failed write of every due topic
                for topic, buf in due.items():
                    self._failed(buf, exc, now, cuts[topic])
                return committed
        for topic, buf in due.items():
            committed.extend(self._flush_topic(topic, buf, now, cuts[topic]))
        return committed

    def _failed(self, buf: _TopicBuffer, exc: Exception, now: float, cut: list[Slice]) -> None:
        """The rows stay buffered; the retry waits longer each time and writes the same cut."""
        buf.retry_cut = cut
        buf.failures += 1
        self.write_errors += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        buf.retry_at = now + min(self.max_backoff_s, 0.1 * 2 ** min(buf.failures, 16))

    def flush_all(self) -> list[tuple[str, int, int]]:
        """Write everything buffered (shutdown, partition revocation); may leave rows on failure."""
        committed: list[tuple[str, int, int]] = []
        for _ in range(2):  # a second pass writes what a row-bound cut left behind
            committed.extend(self.flush_due(force=True))
        return committed

    def _cut(self, topic: str, buf: _TopicBuffer) -> list[Slice]:
        """Take up to ``max_rows`` rows of the topic, each partition cut at an aligned offset."""
        slices, budget = [], self.max_rows
        for partition in sorted(buf.partitions):
            part = buf.partitions[partition]
            if not part.records or budget <= 0:
                continue
            take = len(part.records)
            if take > budget:
                # cut where the offset reaches a multiple of max_rows (same cut after redelivery)
                boundary = (part.first // self.max_rows + 1) * self.max_rows
                take = max(1, min(budget, boundary - part.first, take))
            # records and offsets correspond one to one only when no offset was skipped
            contiguous = part.last - part.first + 1 == len(part.records)
            if take < len(part.records) and not contiguous:
                take = len(part.records)  # cannot map a partial cut to offsets: write it whole
            last = part.first + take - 1 if take < len(part.records) else part.last
            slices.append(Slice(partition, part.first, last, part.records[:take]))
            budget -= take
        return slices

    def _flush_topic(self, topic: str, buf: _TopicBuffer, now: float, slices: list[Slice]) -> list[tuple[str, int, int]]:
        try:
            write_slices = getattr(self.target, "write_slices", None)
            if write_slices is not None:
                write_slices(topic, slices)
            else:
                for s in slices:
                    self.target.write(topic, s.partition, s.first, s.last, s.records)
        except Exception as exc:  # noqa: BLE001 - any failure: keep the rows, retry later
            self._failed(buf, exc, now, slices)
            return []
        buf.retry_cut = None
        buf.failures = 0
        buf.retry_at = 0.0
        self.last_error = ""
        self.inserts += 1
        committed = []
        for s in slices:
            part = buf.partitions[s.partition]
            n = len(s.records)
            del part.records[:n]
            part.first = s.last + 1
            buf.rows -= n
            self.buffered_rows -= n
            self.rows_written += n
            committed.append((topic, s.partition, s.last + 1))
        buf.oldest = now
        return committed
