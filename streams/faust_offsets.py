"""Guard Faust's consumer offset bookkeeping against its rebalance race: commit only what was processed.

Found by the rebalance reliability test (a second worker joins, then leaves, while events flow) and
confirmed by logging Faust's gap handling: after a rebalance, ``Recovery`` resumes the stream
partitions *before* it seeks them to the committed offsets, so Faust's fetch loop
(``Consumer._drain_messages``) can still be handing over records fetched at the old position,
ahead of the committed offset, after the seek reset its *read offset* to the committed one. The
loop then meets a jump (read offset 154, next record 179) and treats it as a compaction gap:
offsets 155..178 are marked as if acknowledged, and the records re-fetched from 154 are dropped
as already read. The next commit moves past records no processor ever saw: silent loss under
at-least-once (2 of 172 alerts in one run, 24 token records in another).

The input topics here are never compacted and never transactional, so their offsets have no
legitimate gaps. For those topics only (Faust's own changelog and internal topics keep Faust's
handling), this module:

- disables the read-offset filter (``_read_offset`` answers "unknown" for them), so no jump
  becomes a gap and no re-fetched record is dropped: a record fetched twice is processed twice,
  which at-least-once and the deterministic derived event ids already absorb;
- makes the commit strict: a partition's offset is committed only when the lowest acknowledged
  offset is exactly the committed one (Faust also accepts a hole of one offset at the head, the
  root of faust-streaming issue 606), so a commit never skips an unprocessed record. A partition
  the group never committed starts at its log start offset (asked from the broker after each
  seek), where Faust would take whatever offset happened to be acknowledged first.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable
from typing import Any


class ReadOffsets(defaultdict):  # type: ignore[type-arg]
    """Faust's per-partition read offsets, except that guarded topics always read as unknown
    (``None``), which turns off the drain loop's gap and duplicate filter for them."""

    def __init__(self, guarded_topics: Iterable[str]) -> None:
        super().__init__(lambda: None)
        self.guarded_topics = frozenset(guarded_topics)

    def __getitem__(self, tp: Any) -> int | None:
        if tp.topic in self.guarded_topics:
            return None
        return super().__getitem__(tp)


def strict_new_offset(consumer: Any, guarded_topics: frozenset[str], faust_new_offset: Callable[[Any], int | None]):
    """``Consumer._new_offset`` that, for guarded topics, commits nothing while the record at the
    committed offset is unacknowledged."""

    def new_offset(tp: Any) -> int | None:
        if tp.topic in guarded_topics:
            acked = consumer._acked[tp]
            committed = consumer._committed_offset[tp]
            if acked and committed is not None and min(acked) != committed:
                return None
        return faust_new_offset(tp)

    return new_offset


def seek_with_log_start(consumer: Any, guarded_topics: frozenset[str], faust_perform_seek: Callable[[], Awaitable[None]]):
    """``Consumer.perform_seek`` that also gives never-committed guarded partitions their log start
    offset as the committed head, so the strict commit has a head to wait for."""

    async def perform_seek() -> None:
        await faust_perform_seek()
        uncommitted = [tp for tp in consumer.assignment()
                       if tp.topic in guarded_topics and consumer._committed_offset[tp] is None]
        if uncommitted:
            for tp, offset in (await consumer.earliest_offsets(*uncommitted)).items():
                if offset is not None and consumer._committed_offset[tp] is None:
                    consumer._committed_offset[tp] = offset

    return perform_seek


def guard_consumer_offsets(consumer: Any, guarded_topics: Iterable[str]) -> None:
    """Install the guards on one Faust consumer (before its fetcher starts: the drain loop binds
    ``_read_offset``'s methods when it starts)."""
    topics = frozenset(guarded_topics)
    previous = consumer._read_offset
    offsets = ReadOffsets(topics)
    offsets.update(previous)
    consumer._read_offset = offsets
    consumer._new_offset = strict_new_offset(consumer, topics, consumer._new_offset)
    consumer.perform_seek = seek_with_log_start(consumer, topics, consumer.perform_seek)


__all__ = ["ReadOffsets", "guard_consumer_offsets", "seek_with_log_start", "strict_new_offset"]
