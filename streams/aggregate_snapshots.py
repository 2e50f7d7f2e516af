"""Counts over many requests survive a crash exactly: a processor's whole state and the input
offsets it covers, in one changelog record.

The aggregating processors (fallback rates, response-rule counts, retrain triggers) keep counts of
open windows in memory, and the worker commits their inputs every second: a worker that died lost
the open windows' counts, and a restarted one counted only what came after the last commit, then
published those windows short (a fallback SLO judged on part of its five minutes, a retrain count
started again). A changelog per key cannot fix that: a count is not idempotent, and a crash
between the changelog write and the offset commit would count the redelivered records twice.

So after every batch that reached such a processor the worker writes one record: the processor's
state (``Processor.snapshot``) with, per input partition, the offset of the last record that state
covers. It goes to the producer after the batch's outputs and before the batch is acknowledged
(Faust flushes the producer before it commits offsets), and snapshots reach the producer in the
order they were taken, so the newest one in the changelog covers every committed offset. A
restarted worker restores it before its first batch and skips, for that processor only, every
record at or below the offset it covers: whatever the crash interrupted, each record counts once.
Outputs made again (a window closed after the snapshot) carry the same event ids and counts.
The snapshot is restored by the processor's first batch after the start, or by the worker's idle
timer when no record comes: a worker restarted into silence restores the newest event time its
inputs had delivered with the windows, counts it as already silent for
``ENTROLOOP_STREAMS_WATERMARK_IDLE_S`` (``WatermarkCadence.resume``), and once the broker says its
inputs are caught up moves event time on from it by the time since the restart, closing the windows
that time has passed.

Stored in a Faust table of one key in changelog partition 0 (compacted: recovery reads one record),
recovered by Faust before the agents get records. One worker per aggregating processor (``entroloop
worker --role aggregates``); several would overwrite each other's snapshot, as their windows are
already partial (the worker's Health says so). A snapshot over the producer's request size is not
written (an error says so): the newest one written stays, and a crash would lose what came after it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import Any

import msgspec
from entroloop.streams.base import Processor
from entroloop.streams.table_state import store_raw

from entroloop.contract.records import Event

log = logging.getLogger(__name__)

KEY = b"snapshot"
PARTITION = 0
"""The one key of a snapshot table, and its changelog partition."""


class CoveredState(msgspec.Struct, array_like=True):
    """A processor's snapshot and, per input partition (``topic:partition``), the last offset it
    covers; ``event_time``: the newest event time its inputs had delivered (absent from snapshots
    written before it was kept: never heard of)."""

    offsets: dict[str, int]
    state: bytes
    event_time: float = float("-inf")


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(CoveredState)


class SnapshotKeeper:
    """One processor's snapshots in its Faust table (``table.data``, a store of bytes)."""

    def __init__(self, processor: Any, table: Any) -> None:
        self.processor = processor
        self.table = table
        self.covered: dict[tuple[str, int], int] = {}
        self.restored = False
        self.event_time = float("-inf")  # the restored snapshot's newest event time
        self.dirty = False  # records processed since the last snapshot taken
        self.skipped = 0  # records a restored snapshot already covered
        self.last_bytes = 0  # size of the newest snapshot taken (Health ``snapshot_bytes``)
        self.unwritten = 0  # snapshots over the producer's request size, not written (``snapshots_unwritten``)
        self.sending = asyncio.Lock()  # snapshots reach the producer in the order they are taken

    def restore_once(self) -> None:
        """Load the newest snapshot into the processor, once (the table is recovered by then)."""
        if self.restored:
            return
        self.restored = True
        raw = self.table.data.get(KEY)
        if raw is None:
            return
        try:
            covered = _DECODER.decode(raw)
            if covered.state:
                self.processor.restore(covered.state)
            offsets = {}
            for key, offset in covered.offsets.items():
                topic, _, partition = key.rpartition(":")
                offsets[(topic, int(partition))] = offset
        except Exception:  # an unreadable snapshot must not stop the worker for good
            log.exception("%s: its snapshot cannot be read (%d bytes); starting from an empty state: the "
                          "windows open at the last stop count only what comes next", self.processor.name, len(raw))
            return
        self.covered = offsets
        self.event_time = covered.event_time
        log.info("%s: state restored, covering %d input partitions", self.processor.name, len(offsets))

    def unseen(self, batch: Sequence[tuple[Event, Any]]) -> list[tuple[Event, Any]]:
        """The batch's records that the state does not cover yet (a redelivery after a crash)."""
        covered = self.covered
        kept = [(record, message) for record, message in batch
                if message.offset > covered.get((message.topic, message.partition), -1)]
        self.skipped += len(batch) - len(kept)
        return kept

    def cover(self, batch: Sequence[tuple[Event, Any]]) -> None:
        """Note that the state now covers ``batch`` (called right after the processor took it)."""
        covered = self.covered
        for _, message in batch:
            key = (message.topic, message.partition)
            if message.offset > covered.get(key, -1):
                covered[key] = message.offset
        self.dirty = self.dirty or bool(batch)

    def take(self, event_time: float = float("-inf")) -> bytes:
        """The snapshot as its changelog value, also written to the table's store (what a
        rebalance onto this worker would recover). ``event_time``: the newest its inputs delivered."""
        raw = _ENCODER.encode(CoveredState(
            offsets={f"{topic}:{partition}": offset for (topic, partition), offset in self.covered.items()},
            state=self.processor.snapshot() or b"",
            event_time=event_time,
        ))
        store_raw(self.table.data, KEY, raw, PARTITION)
        self.dirty = False
        self.last_bytes = len(raw)
        return raw


def keeps_snapshots(processor: Any) -> bool:
    """True for a processor that implements ``snapshot`` (the aggregating ones)."""
    return type(processor).snapshot is not Processor.snapshot


__all__ = ["KEY", "PARTITION", "CoveredState", "SnapshotKeeper", "keeps_snapshots"]
