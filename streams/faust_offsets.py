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
  seek), where Faust would take whatever offset happened to be acknowledged first; and a partition
  whose committed offset is unknown commits nothing. That is the time between a revocation (Faust
  forgets the partition's committed offset) and the next seek: batches that finish meanwhile still
  acknowledge their offsets, and Faust committed from the first of them, past the record the
  commit was held at (found by ``tests/reliability/rebalance_churn.py``: the commit of a partition
  held at 2645 for 5 s jumped to 2762 half a second after "Revoking", the record at 2647 never
  processed: an alert lost);
- has a record that holds the commit delivered again: Faust's streams skip, unacknowledged, records
  handed over while flow control is suspended during a recovery (and Faust's one-offset-hole rule
  then commits past them: another silent loss). A head record that nothing is processing for
  ``REDELIVER_AFTER_S`` is fetched again by seeking back to it (found by the bad-case join restart
  test, where it held a partition's commit for minutes: 32 of 41 feedback records committed);
- watches for a partition where *every* record after the committed offset was skipped: then
  nothing is acknowledged there, Faust's commit never looks at it (it only visits partitions with
  acknowledgements), and the hold above never fires. ``stalled_partition_check`` (run by a timer)
  seeks such a partition back to its committed offset once it has sat ``REDELIVER_AFTER_S`` behind
  its high watermark with nothing in flight (found in CI: a worker restarted after a SIGKILL said
  "Ready" and then committed nothing for 120 s, 23 of 41 audit records acknowledged).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

log = logging.getLogger(__name__)

REDELIVER_AFTER_S = 5.0
"""How long the commit may be held at a record nothing is processing before it is fetched again."""


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


def strict_new_offset(
    consumer: Any,
    guarded_topics: frozenset[str],
    faust_new_offset: Callable[[Any], int | None],
    redeliver_after_s: float = REDELIVER_AFTER_S,
    clock: Callable[[], float] = time.monotonic,
):
    """``Consumer._new_offset`` that, for guarded topics, commits nothing while the record at the
    committed offset is unacknowledged, and has that record delivered again when nothing is
    processing it (see ``_redeliver_head``)."""
    held_since: dict[Any, tuple[int, float]] = {}

    def new_offset(tp: Any) -> int | None:
        if tp.topic in guarded_topics:
            acked = consumer._acked[tp]
            committed = consumer._committed_offset[tp]
            if committed is None:
                # No head to hold the commit at: between a revocation (which forgets the committed
                # offset) and the next seek (which sets it, the log start if the group never
                # committed), batches finished meanwhile still acknowledge offsets, and Faust would
                # commit from the first of them, past a held head (rebalance churn soak: 1 alert).
                return None
            if acked and min(acked) != committed:
                since = held_since.setdefault(tp, (committed, clock()))
                if since[0] != committed:
                    held_since[tp] = since = (committed, clock())
                if clock() - since[1] >= redeliver_after_s and _redeliver_head(consumer, tp, committed):
                    held_since[tp] = (committed, clock())
                return None
            held_since.pop(tp, None)
        return faust_new_offset(tp)

    return new_offset


def _redeliver_head(consumer: Any, tp: Any, offset: int) -> bool:
    """Seek ``tp`` back to ``offset`` if the record there is not being processed.

    Faust's streams skip, unacknowledged, records handed over while flow control is suspended or
    from an older generation (a rebalance, a recovery); Faust then relies on its one-offset-hole
    rule to commit past them, which loses them. Guarded, such a record holds the commit; seeking
    back fetches it (and what follows, again) so it is processed. Returns whether it seeked."""
    if consumer.app.rebalancing or tp not in consumer.assignment():
        return False
    if any(m.tp == tp and m.offset == offset for m in list(consumer._unacked_messages)):
        return False  # in flight: a slow processor, not a skipped record
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return False  # called outside the worker's loop (tests of the arithmetic)
    log.warning("offset %s of %s was skipped by Faust and never acknowledged: the commit is held there; "
                "seeking back to deliver it again", offset, tp)
    loop.create_task(seek_on_consumer_thread(consumer, tp, offset))
    return True


async def seek_on_consumer_thread(consumer: Any, tp: Any, offset: int) -> None:
    """``Consumer.seek``, but run on the consumer's own thread. Faust's ``Consumer.seek`` calls
    aiokafka's ``seek`` from the app's thread while the consumer thread iterates the fetcher's
    records: the seek deleted a partition's entry mid-iteration, the Fetcher crashed with a KeyError
    and the worker stayed up doing nothing (CI, test_rebalance_second_worker_joins_then_leaves: two
    alerts never made). ``seek_wait`` hands the seek to the consumer thread and waits for it."""
    await consumer.seek_wait({tp: offset})
    consumer._read_offset[tp] = offset if offset else None  # as Consumer.seek: re-read from here


def stalled_partition_check(
    consumer: Any,
    guarded_topics: frozenset[str],
    redeliver_after_s: float = REDELIVER_AFTER_S,
    clock: Callable[[], float] = time.monotonic,
) -> Callable[[], list[Any]]:
    """A check for a timer: each assigned guarded partition that has records after its committed
    offset (high watermark > committed) but nothing acknowledged and nothing in flight, with the same
    committed offset for ``redeliver_after_s``, is sought back to that offset (``_redeliver_head``).
    A partition being worked on always has a message in flight or an acknowledgement, so a healthy
    worker is never sought back. Returns the partitions it sought, for tests and logs."""
    idle_since: dict[Any, tuple[int, float]] = {}

    def check() -> list[Any]:
        sought = []
        in_flight = {m.tp for m in list(consumer._unacked_messages)}
        for tp in list(consumer.assignment()):
            if tp.topic not in guarded_topics:
                continue
            committed = consumer._committed_offset.get(tp)
            try:
                highwater = consumer.highwater(tp)
            except Exception:  # noqa: BLE001 - not fetched yet: nothing is known to be waiting
                highwater = None
            if (committed is None or highwater is None or highwater <= committed
                    or consumer._acked.get(tp) or tp in in_flight):
                idle_since.pop(tp, None)
                continue
            since = idle_since.get(tp)
            if since is None or since[0] != committed:
                idle_since[tp] = (committed, clock())
            elif clock() - since[1] >= redeliver_after_s and _redeliver_head(consumer, tp, committed):
                idle_since[tp] = (committed, clock())
                sought.append(tp)
        return sought

    return check


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


__all__ = ["ReadOffsets", "guard_consumer_offsets", "seek_on_consumer_thread", "seek_with_log_start",
           "stalled_partition_check", "strict_new_offset"]
