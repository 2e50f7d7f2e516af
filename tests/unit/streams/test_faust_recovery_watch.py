"""The stalled-recovery check (entroloop.streams.faust_recovery_watch), on the worker app's own Faust
``Recovery`` and consumer: only the broker calls are replaced (the assignment, and the seek that
runs on the consumer thread), so a Faust upgrade that renames the recovery's bookkeeping fails here.

One failure mode is shown end to end with the worker's fetch loop (``Consumer._drain_messages``): a
changelog partition whose read offset is left past the records the recovery needs drops every
one of them (Faust's recovery then waits forever); fetched again by the check, they arrive.
"""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from aiokafka.structs import ConsumerRecord
from entroloop.streams.app import build_streams_app
from entroloop.streams.faust_recovery_watch import stalled_recovery_check
from faust.types import TP

from entroloop.contract.settings import Settings

CHANGELOG = "t.entroloop-streams-bad_case_join-changelog"
KEPT, TAKEN_BACK = TP(CHANGELOG, 4), TP(CHANGELOG, 1)


def _worker() -> tuple[Any, Any, list[tuple[int, int]]]:
    """The worker app's recovery and consumer in the middle of a recovery started at t=100: the
    partition it kept is read up to 107 of 280, the one it took back has 264 records, none read."""
    app = build_streams_app(Settings(kafka_bootstrap="127.0.0.1:9", topic_prefix="t.")).app
    recovery, consumer = app.tables.recovery, app.consumer
    seeks: list[tuple[int, int]] = []

    async def seek_wait(partitions: dict[TP, int]) -> None:  # the seek on the consumer's thread
        seeks.extend((tp.partition, offset) for tp, offset in partitions.items())

    consumer.seek_wait = seek_wait
    consumer.assignment = lambda: {KEPT, TAKEN_BACK}
    recovery.in_recovery = True
    recovery._recovery_started_at = 100.0
    # Counters both (``update`` would add): Faust stores the highwater less one
    recovery.active_highwaters[KEPT], recovery.active_highwaters[TAKEN_BACK] = 279, 263
    recovery.active_offsets[KEPT], recovery.active_offsets[TAKEN_BACK] = 107, -1
    return recovery, consumer, seeks


def _ticks(consumer: Any, check: Any, now: list[float], times: list[float],
           between: Any = None) -> list[list[int]]:
    """Run ``check`` at each time; ``between(t)`` changes the recovery's state before each."""
    fetched: list[list[int]] = []

    async def run() -> None:
        for t in times:
            now[0] = t
            if between is not None:
                between(t)
            fetched.append(sorted(tp.partition for tp in check()))
            await asyncio.sleep(0)  # the seek task runs

    consumer.loop.run_until_complete(run())
    return fetched


def test_a_partition_that_receives_nothing_is_fetched_again_from_the_recovery_offset() -> None:
    recovery, consumer, seeks = _worker()
    consumer._paused_partitions.add(TAKEN_BACK)  # one of the ways its records never come
    consumer._read_offset[TAKEN_BACK] = 263
    now = [100.0]
    check = stalled_recovery_check(recovery, consumer, stall_after_s=15.0, clock=lambda: now[0])

    def kept_receives(t: float) -> None:
        recovery._active_events_received_at[KEPT] = t  # a record every tick

    fetched = _ticks(consumer, check, now, [105.0, 114.9, 115.0, 120.0, 129.9, 130.0], kept_receives)
    assert fetched == [[], [], [1], [], [], [1]]  # at 15 s of silence, then 15 s after each fetch
    assert seeks == [(1, 0), (1, 0)]  # -1 (nothing read) is read from offset 0, as Faust seeks it
    assert TAKEN_BACK not in consumer._paused_partitions and TAKEN_BACK in consumer._active_partitions
    assert consumer._read_offset[TAKEN_BACK] is None  # forgotten: offset 0 onwards passes the filter


def test_the_silence_counts_from_the_last_record_received() -> None:
    recovery, consumer, seeks = _worker()
    recovery._active_events_received_at[TAKEN_BACK] = 110.0
    recovery.active_offsets[TAKEN_BACK] = 40
    now = [100.0]
    check = stalled_recovery_check(recovery, consumer, stall_after_s=15.0, clock=lambda: now[0])
    recovery._active_events_received_at[KEPT] = 200.0
    assert _ticks(consumer, check, now, [115.0, 124.9, 125.0]) == [[], [], [1]]
    assert seeks == [(1, 40)]  # from the offset read last: the recovery skips what it has


def test_caught_up_or_unassigned_partitions_and_finished_recoveries_are_left_alone() -> None:
    recovery, consumer, seeks = _worker()
    recovery.active_offsets[KEPT], recovery.active_offsets[TAKEN_BACK] = 279, 263  # both caught up
    now = [100.0]
    check = stalled_recovery_check(recovery, consumer, stall_after_s=15.0, clock=lambda: now[0])
    assert _ticks(consumer, check, now, [200.0]) == [[]]

    recovery.active_offsets[TAKEN_BACK] = -1
    consumer.assignment = lambda: {KEPT}  # revoked meanwhile: a rebalance owns it now
    assert _ticks(consumer, check, now, [300.0]) == [[]]

    consumer.assignment = lambda: {KEPT, TAKEN_BACK}
    recovery.in_recovery = False
    assert _ticks(consumer, check, now, [400.0]) == [[]]
    assert seeks == []


def test_a_new_recovery_starts_the_silence_afresh() -> None:
    recovery, consumer, _seeks = _worker()
    now = [100.0]
    check = stalled_recovery_check(recovery, consumer, stall_after_s=15.0, clock=lambda: now[0])
    recovery._active_events_received_at[KEPT] = 1000.0

    def restart(t: float) -> None:
        if t == 500.0:
            recovery._recovery_started_at = 495.0  # a rebalance began another recovery

    assert _ticks(consumer, check, now, [115.0, 500.0, 510.0], restart) == [[1], [], [1]]


def _drain_changelog(consumer: Any, offsets: list[int]) -> list[int]:
    """The worker's fetch loop (``_drain_messages``) over the taken-back changelog partition's
    records (one fetch); the offsets it hands to the recovery."""
    delivered: list[int] = []
    fetcher = SimpleNamespace(_stopped=asyncio.Event())
    records = [ConsumerRecord(CHANGELOG, TAKEN_BACK.partition, offset, 0, 0, b"k", b"v", None, 1, 1, ())
               for offset in offsets]

    async def callback(message: Any) -> None:
        delivered.append(message.offset)

    async def wait_next_records(timeout: float) -> tuple[dict[TP, list[ConsumerRecord]], None]:
        fetcher._stopped.set()
        return {TAKEN_BACK: records}, None

    consumer.callback, consumer._wait_next_records = callback, wait_next_records
    consumer.highwater = lambda _tp: len(offsets)
    consumer.app.topics.acks_enabled_for = lambda _topic: False  # changelogs are not acknowledged
    consumer.loop.run_until_complete(asyncio.wait_for(consumer._drain_messages(fetcher), 30))
    return delivered


def test_records_dropped_by_a_read_offset_left_from_an_earlier_assignment_arrive_once_fetched_again() -> None:
    recovery, consumer, _seeks = _worker()
    consumer._read_offset[TAKEN_BACK] = 300  # past the 264 records the recovery waits for
    assert _drain_changelog(consumer, list(range(264))) == []  # Faust drops them all, silently

    now = [100.0]
    check = stalled_recovery_check(recovery, consumer, stall_after_s=15.0, clock=lambda: now[0])
    recovery._active_events_received_at[KEPT] = 1000.0
    assert _ticks(consumer, check, now, [115.0]) == [[1]]
    assert _drain_changelog(consumer, list(range(264))) == list(range(264))


def test_the_worker_task_counts_what_it_fetched_again_and_outlives_a_failing_check(caplog) -> None:
    """``watch_recovery`` is the worker's task (Health ``recovery_refetches`` counts its fetches);
    a check that raises (the consumer mid-rebalance) is logged and the next run goes on."""
    import time

    from entroloop.streams.faust_recovery_watch import watch_recovery

    recovery, consumer, seeks = _worker()
    recovery._recovery_started_at = time.monotonic() - 100  # silent for 100 s
    recovery._active_events_received_at[KEPT] = time.monotonic() + 3600
    app = SimpleNamespace(tables=SimpleNamespace(recovery=recovery), consumer=consumer, should_stop=False)
    calls = []

    def assignment() -> set:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("no current assignment")
        return {KEPT, TAKEN_BACK}

    consumer.assignment = assignment
    counted: list[int] = []

    def on_refetch(partitions: int) -> None:
        counted.append(partitions)
        app.should_stop = True

    with caplog.at_level("ERROR"):
        consumer.loop.run_until_complete(asyncio.wait_for(watch_recovery(app, on_refetch, interval_s=0), 10))
        consumer.loop.run_until_complete(asyncio.sleep(0))  # the seek task
    assert counted == [1] and seeks == [(1, 0)]
    assert "the table recovery check failed" in caplog.text
