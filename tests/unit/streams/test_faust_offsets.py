"""The guard against Faust's rebalance race (entroloop.streams.faust_offsets), on Faust's own consumer code.

The race, as logged in the rebalance reliability test: after a seek to the committed offset 154,
Faust's fetch loop still hands over a record fetched at the old position (179), then the records
re-fetched from 154. The fetch loop (``Consumer._drain_messages``: Faust's own on a plain app, the
worker's ``lean_drain_messages`` on the worker's) runs here on that scripted fetch: unguarded it
marks 155..178 as a compaction gap and drops the re-fetched records (the loss); guarded it delivers
every record and commits nothing past an unprocessed one.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import faust
from aiokafka.structs import ConsumerRecord
from entroloop.streams.app import build_streams_app
from entroloop.streams.faust_offsets import (
    guard_consumer_offsets,
    seek_with_log_start,
    strict_new_offset,
)
from faust.types import TP

from entroloop.contract.settings import Settings


def _consumer(guarded: bool) -> tuple[Any, str]:
    """The worker app's consumer (guarded), or a plain Faust app's (the bookkeeping it replaces)."""
    if guarded:
        app = build_streams_app(Settings(kafka_bootstrap="127.0.0.1:9", topic_prefix="t.")).app
    else:
        app = faust.App("plain", broker="kafka://127.0.0.1:9", web_enabled=False)
    return app.consumer, "t.entroloop.tokens.v1"


def _drain(consumer: Any, topic: str, committed: int, offsets: list[int]) -> list[int]:
    """Run the consumer's fetch loop (``_drain_messages``: Faust's own on a plain app, the worker's
    ``lean_drain_messages`` on the worker's) over ``offsets`` (one fetch) after a seek to
    ``committed``; returns the offsets it delivered to the streams."""
    tp = TP(topic, 4)
    consumer._read_offset[tp] = committed  # what perform_seek sets
    consumer._committed_offset[tp] = committed
    delivered: list[int] = []
    fetcher = SimpleNamespace(_stopped=asyncio.Event())
    records = [ConsumerRecord(topic, 4, offset, 0, 0, b"k", b"v", None, 1, 1, ()) for offset in offsets]

    async def callback(message: Any) -> None:
        delivered.append(message.offset)

    async def getmany(timeout: float):  # Faust's async iterator protocol (its own loop)
        for record in records:
            yield tp, consumer._to_message(tp, record)
        fetcher._stopped.set()

    async def wait_next_records(timeout: float) -> tuple[dict[TP, list[ConsumerRecord]], set[TP]]:  # the worker's loop
        fetcher._stopped.set()
        return {tp: records}, {tp}

    consumer.callback = callback
    consumer.getmany, consumer._wait_next_records = getmany, wait_next_records
    consumer.highwater = lambda _tp: offsets[-1] + 1
    consumer.app.topics.acks_enabled_for = lambda _topic: True
    # on the consumer's own loop: Faust's services create their futures there
    consumer.loop.run_until_complete(asyncio.wait_for(consumer._drain_messages(fetcher), 30))
    return delivered


STALE_THEN_REFETCHED = [179, 180, *range(154, 181)]


def test_unguarded_faust_drops_the_refetched_records_and_marks_them_as_a_gap() -> None:
    consumer, topic = _consumer(guarded=False)
    delivered = _drain(consumer, topic, 154, STALE_THEN_REFETCHED)
    assert delivered == [179, 180, 180]  # the re-fetched 154..179 dropped as "already read"
    gap = consumer._gap[TP(topic, 4)]
    assert sorted((i.begin, i.end) for i in gap) == [(155, 180)]  # 155..179 taken as compacted away


def test_guarded_consumer_delivers_every_record_and_adds_no_gap() -> None:
    consumer, topic = _consumer(guarded=True)
    delivered = _drain(consumer, topic, 154, STALE_THEN_REFETCHED)
    assert delivered == STALE_THEN_REFETCHED  # the stale ones twice: at-least-once, never fewer
    assert not consumer._gap[TP(topic, 4)]


def test_guarded_commit_waits_for_the_record_at_the_committed_offset() -> None:
    consumer, topic = _consumer(guarded=True)
    tp = TP(topic, 4)
    consumer._committed_offset[tp] = 154
    consumer._acked[tp] = list(range(155, 181))  # everything but the head
    assert consumer._new_offset(tp) is None
    consumer._acked[tp].append(154)
    assert consumer._new_offset(tp) == 181


def test_faust_alone_commits_past_a_one_offset_hole_at_the_head() -> None:
    """The behaviour the strict commit replaces (faust-streaming issue 606)."""
    consumer, topic = _consumer(guarded=False)
    tp = TP(topic, 4)
    consumer._committed_offset[tp] = 154
    consumer._acked[tp] = list(range(155, 181))
    assert consumer._new_offset(tp) == 181  # 154 never processed, yet committed past


def test_faust_internal_topics_keep_fausts_read_offsets() -> None:
    consumer, topic = _consumer(guarded=True)
    changelog = TP("t.entroloop-streams-bad_case_join-changelog", 0)
    consumer._read_offset[changelog] = 42
    consumer._read_offset[TP(topic, 0)] = 42
    assert consumer._read_offset[changelog] == 42
    assert consumer._read_offset[TP(topic, 0)] is None


def test_guard_keeps_offsets_read_before_it_was_installed() -> None:
    consumer, _ = _consumer(guarded=False)
    consumer._read_offset[TP("other", 0)] = 7
    guard_consumer_offsets(consumer, ["t.entroloop.tokens.v1"])
    assert consumer._read_offset[TP("other", 0)] == 7


def test_a_never_committed_partition_waits_for_its_log_start_offset() -> None:
    """A fresh group: Faust knows no committed offset, so it would commit from whatever offset was
    acknowledged first; after the guarded seek the head is the partition's log start offset."""
    consumer, topic = _consumer(guarded=True)
    tp = TP(topic, 2)
    seeks: list[str] = []

    async def faust_seek() -> None:
        seeks.append("faust")

    async def earliest_offsets(*tps: TP) -> dict[TP, int]:
        return {t: 0 for t in tps}

    consumer.assignment = lambda: {tp, TP("t.entroloop-streams-bad_case_join-changelog", 2)}
    consumer.earliest_offsets = earliest_offsets
    consumer.perform_seek = seek_with_log_start(
        consumer, frozenset([topic]), faust_seek)
    consumer.loop.run_until_complete(consumer.perform_seek())
    assert seeks == ["faust"] and consumer._committed_offset[tp] == 0
    assert consumer._committed_offset[TP("t.entroloop-streams-bad_case_join-changelog", 2)] is None
    consumer._acked[tp] = list(range(1, 10))  # offset 0 still in flight
    assert consumer._new_offset(tp) is None
    consumer._acked[tp].append(0)
    assert consumer._new_offset(tp) == 10


class _InFlight:
    """A tracked, unacknowledged message (weak-referenceable, as Faust's WeakSet needs)."""

    def __init__(self, tp: TP, offset: int) -> None:
        self.tp, self.offset = tp, offset


def _seeking_consumer() -> tuple[Any, str, TP, list[tuple[int, int]]]:
    """The worker's consumer with partition 4 of a guarded topic, recording the seeks it makes."""
    consumer, topic = _consumer(guarded=True)
    tp = TP(topic, 4)
    seeks: list[tuple[int, int]] = []

    async def seek_wait(partitions: dict[TP, int]) -> None:  # runs the seek on the consumer's thread
        seeks.extend((partition.partition, offset) for partition, offset in partitions.items())

    async def seek(partition: TP, offset: int) -> None:
        raise AssertionError("Consumer.seek runs aiokafka's seek on the app's thread, racing the consumer "
                             "thread's fetch loop (a KeyError crashed the Fetcher in CI)")

    consumer.seek_wait, consumer.seek = seek_wait, seek
    return consumer, topic, tp, seeks


def _held_head(in_flight: bool) -> list[tuple[int, int]]:
    """Commit attempts while offset 8 holds the commit (9..19 acknowledged): the seeks they made."""
    consumer, topic, tp, seeks = _seeking_consumer()
    now = [0.0]
    consumer.assignment = lambda: {tp}
    consumer._new_offset = strict_new_offset(consumer, frozenset([topic]), lambda _tp: None,
                                             redeliver_after_s=5.0, clock=lambda: now[0])
    consumer._committed_offset[tp] = 8
    consumer._acked[tp] = list(range(9, 20))
    message = _InFlight(tp, 8)
    if in_flight:
        consumer._unacked_messages.add(message)

    async def commit_attempts() -> None:
        for t in (0.0, 4.9, 5.0, 6.0):
            now[0] = t
            assert consumer._new_offset(tp) is None
            await asyncio.sleep(0)

    consumer.loop.run_until_complete(commit_attempts())
    return seeks


def test_a_skipped_head_record_is_fetched_again_after_the_hold() -> None:
    """Faust's streams skip records handed over while flow control is suspended; the commit holds
    at such a record, and after 5 s the consumer seeks back to it, once."""
    assert _held_head(in_flight=False) == [(4, 8)]


def test_a_head_record_still_being_processed_is_not_fetched_again() -> None:
    assert _held_head(in_flight=True) == []


def _stalled(highwater: int, acked: list[int], in_flight: bool) -> list[tuple[int, int]]:
    """Timer checks on a partition committed at 8: the seeks they made."""
    from entroloop.streams.faust_offsets import stalled_partition_check

    consumer, topic, tp, seeks = _seeking_consumer()
    now = [0.0]
    consumer.assignment = lambda: {tp, TP("t.entroloop-streams-bad_case_join-changelog", 4)}
    consumer.highwater = lambda partition: highwater
    consumer._committed_offset[tp] = 8
    if acked:
        consumer._acked[tp] = acked
    message = _InFlight(tp, 12)
    if in_flight:
        consumer._unacked_messages.add(message)
    check = stalled_partition_check(consumer, frozenset([topic]), redeliver_after_s=5.0, clock=lambda: now[0])

    async def ticks() -> None:
        for t in (0.0, 2.5, 4.9, 5.0, 7.5, 9.9, 10.0):
            now[0] = t
            check()
            await asyncio.sleep(0)

    consumer.loop.run_until_complete(ticks())
    return seeks


def test_a_partition_whose_every_record_was_skipped_is_fetched_again() -> None:
    """Nothing acknowledged and nothing in flight while records wait past the committed offset: the
    commit path never visits the partition, so the timer seeks it back, once per 5 s held."""
    assert _stalled(highwater=20, acked=[], in_flight=False) == [(4, 8), (4, 8)]


def test_a_partition_being_worked_on_or_caught_up_is_left_alone() -> None:
    assert _stalled(highwater=20, acked=[], in_flight=True) == []  # a record is being processed
    assert _stalled(highwater=20, acked=[9, 10], in_flight=False) == []  # the commit path's hold decides
    assert _stalled(highwater=8, acked=[], in_flight=False) == []  # nothing after the committed offset


def test_faust_consumer_offers_the_seek_that_runs_on_its_own_thread() -> None:
    """The seek-back relies on ``Consumer.seek_wait(partitions)`` (a coroutine handing the seek to
    the consumer thread); a Faust upgrade that drops or changes it must fail here, not in a worker."""
    import inspect

    from faust.transport.drivers.aiokafka import Consumer

    assert inspect.iscoroutinefunction(Consumer.seek_wait)
    assert list(inspect.signature(Consumer.seek_wait).parameters) == ["self", "partitions"]


def test_a_partition_whose_committed_offset_was_forgotten_commits_nothing() -> None:
    """A revocation makes Faust forget the committed offset (until the next seek sets it), while
    batches that finish meanwhile still acknowledge theirs: Faust alone commits from the first of
    those, past the record the commit was held at (the rebalance churn soak: held at 2645, 2647
    never processed, 2762 committed half a second after "Revoking")."""
    consumer, topic = _consumer(guarded=True)
    tp = TP(topic, 5)
    consumer._committed_offset[tp] = 2645
    consumer._acked[tp] = [2646, *range(2675, 2762)]  # 2645 and 2647..2674 not processed
    assert consumer._new_offset(tp) is None  # held at 2645
    consumer._committed_offset.pop(tp)  # what Consumer.on_partitions_revoked does
    assert consumer._new_offset(tp) is None  # still nothing: no head is known to hold at

    plain, _ = _consumer(guarded=False)
    plain._acked[tp] = [2646, *range(2675, 2762)]
    assert plain._new_offset(tp) == 2647  # Faust alone: past 2645, and the next commit past 2647..2674
