"""streams/faust_drain.py against Faust's own fetch loop: ``lean_drain_messages`` hands over the
same records, in the same order, with the same read offsets, gaps and end offsets as Faust's
``Consumer._drain_messages`` and ``getmany`` on the same fetches; a callback that has to wait still
races the flow's suspension through mode's ``wait_first``."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import faust
import pytest
from aiokafka.structs import ConsumerRecord
from entroloop.streams.faust_drain import lean_drain_messages
from faust.types import TP

TOKENS, AUDIT = "t.tokens", "t.audit"


def _consumer(lean: bool) -> Any:
    """A plain Faust app's consumer, with Faust's fetch loop or the lean one; no broker is reached
    (the fetches are scripted below ``getmany``)."""
    app = faust.App(f"drain-{lean}", broker="kafka://127.0.0.1:9", web_enabled=False)
    consumer = app.consumer
    if lean:
        consumer._drain_messages = lean_drain_messages(consumer)
    consumer.app.topics.acks_enabled_for = lambda _topic: True
    consumer.highwater = lambda tp: 1000 + tp.partition
    return consumer


def _records(tp: TP, offsets: list[int]) -> list[ConsumerRecord]:
    return [ConsumerRecord(tp.topic, tp.partition, offset, 1_700_000_000_000 + offset, 0, b"k", b"v", None, 1, 1, ())
            for offset in offsets]


def _drain(consumer: Any, fetches: list[dict[TP, list[ConsumerRecord]]], callback: Any = None,
           between: Any = None) -> list[tuple[str, int, int]]:
    """Run the consumer's ``_drain_messages`` over ``fetches`` (what ``_wait_next_records`` returns,
    one per call; then the fetcher stops); the (topic, partition, offset) it delivered, in order.
    ``between(n)`` runs before fetch ``n`` is returned."""
    delivered: list[tuple[str, int, int]] = []
    fetcher = SimpleNamespace(_stopped=asyncio.Event())
    pending = list(fetches)

    async def deliver(message: Any) -> None:
        delivered.append((message.topic, message.partition, message.offset))

    async def wait_next_records(timeout: float) -> tuple[dict[TP, list[ConsumerRecord]], set[TP]]:
        if between is not None:
            between(len(fetches) - len(pending))
        records = pending.pop(0)
        if not pending:
            fetcher._stopped.set()
        return records, set(records)

    consumer.callback = callback(delivered) if callback is not None else deliver
    consumer._wait_next_records = wait_next_records
    consumer.loop.run_until_complete(asyncio.wait_for(consumer._drain_messages(fetcher), 30))
    return delivered


P0, P1, A0 = TP(TOKENS, 0), TP(TOKENS, 1), TP(AUDIT, 0)
FETCHES = [
    {P0: _records(P0, [5, 6, 7]), P1: _records(P1, [40, 41]), A0: _records(A0, list(range(150)))},
    # offset 12 after 7 on P0: a gap Faust marks as acknowledged; 3 on P1: behind its read offset, dropped
    {P0: _records(P0, [12, 13]), P1: _records(P1, [3, 42])},
]


def test_the_same_records_in_the_same_order_with_the_same_bookkeeping_as_fausts_loop() -> None:
    outcomes = []
    for lean in (False, True):
        consumer = _consumer(lean)
        delivered = _drain(consumer, FETCHES)
        gaps = {tp: sorted((i.begin, i.end) for i in consumer._gap[tp]) for tp in (P0, P1, A0)}
        outcomes.append((delivered, dict(consumer._read_offset), gaps, dict(consumer.app.monitor.tp_end_offsets)))
    fausts, lean = outcomes
    assert lean == fausts
    delivered, read_offsets, gaps, end_offsets = lean
    # round-robin between the topics (and their partitions), Faust's order; the record behind its
    # read offset dropped
    assert delivered[:5] == [(TOKENS, 0, 5), (AUDIT, 0, 0), (TOKENS, 1, 40), (AUDIT, 0, 1), (TOKENS, 0, 6)]
    assert len(delivered) == 3 + 2 + 150 + 2 + 1 and (TOKENS, 1, 3) not in delivered
    assert read_offsets == {P0: 13, P1: 42, A0: 149} and gaps[P0] == [(8, 13)]  # Faust's interval: end inclusive
    assert end_offsets == {P0: 1000, P1: 1001, A0: 1000}


@pytest.mark.parametrize("lean", [False, True], ids=["fausts_loop", "lean_loop"])
def test_a_partition_revoked_during_the_fetch_is_not_asked_for_its_high_watermark(lean: bool) -> None:
    """aiokafka asserts that a partition is assigned when asked for its high watermark: asked after
    the fetch's records were handed over, a partition revoked meanwhile (a rebalance while a record
    waited) crashed the fetch loop and the worker. It is asked at the partition's first record."""
    consumer = _consumer(lean)
    revoked: set[TP] = set()

    def highwater(tp: TP) -> int:
        assert tp not in revoked, "Partition is not assigned"
        return 1000 + tp.partition

    consumer.highwater = highwater

    def revoking(delivered: list[tuple[str, int, int]]) -> Any:
        async def deliver(message: Any) -> None:
            delivered.append((message.topic, message.partition, message.offset))
            if message.offset == 6:  # the fetch's last record: P1's was handed over before it
                revoked.add(P1)
        return deliver

    delivered = _drain(consumer, [{P0: _records(P0, [5, 6]), P1: _records(P1, [40])}], revoking)
    assert delivered == [(TOKENS, 0, 5), (TOKENS, 1, 40), (TOKENS, 0, 6)]
    assert dict(consumer.app.monitor.tp_end_offsets) == {P0: 1000, P1: 1001}


def test_records_are_handed_over_without_a_task_each() -> None:
    consumer = _consumer(lean=True)
    tasks: list[int] = []

    def counting(delivered: list[tuple[str, int, int]]) -> Any:
        async def deliver(message: Any) -> None:
            tasks.append(len(asyncio.all_tasks()))
            delivered.append((message.topic, message.partition, message.offset))
        return deliver

    delivered = _drain(consumer, FETCHES, counting)
    assert len(delivered) == 158 and len(set(tasks)) == 1  # no record made a task of its own


def test_a_long_fetch_lets_the_other_tasks_run_every_hundred_records() -> None:
    """Faust's loop sleeps every 100 records too (its ``wait_first``, four tasks per record, also
    yields at every record: the cost the lean loop saves)."""
    consumer = _consumer(lean=True)
    counts: list[int] = []
    seen: list[tuple[str, int, int]] = []

    def counted(delivered: list[tuple[str, int, int]]) -> Any:
        nonlocal seen
        seen = delivered

        async def deliver(message: Any) -> None:
            delivered.append((message.topic, message.partition, message.offset))
        return deliver

    async def another_task() -> None:  # an agent, say: it must not starve while a fetch is handed over
        while True:
            counts.append(len(seen))
            await asyncio.sleep(0)

    watcher = consumer.loop.create_task(another_task())
    _drain(consumer, [{A0: _records(A0, list(range(350)))}], counted)
    watcher.cancel()
    assert [n for n in sorted(set(counts)) if 0 < n < 350] == [100, 201, 302]  # yields before the 101st, 202nd, ...


def test_a_callback_that_waits_holds_the_next_record_until_it_is_delivered() -> None:
    consumer = _consumer(lean=True)
    queue: asyncio.Queue[int] = asyncio.Queue(maxsize=1)

    def into_a_full_queue(delivered: list[tuple[str, int, int]]) -> Any:
        async def deliver(message: Any) -> None:
            await queue.put(message.offset)  # the stream's buffer: full after the first record
            delivered.append((message.topic, message.partition, message.offset))
        return deliver

    async def reader() -> list[int]:
        taken = []
        while len(taken) < 3:
            await asyncio.sleep(0.01)  # a slow stream
            taken.append(await queue.get())
        return taken

    reading = consumer.loop.create_task(reader())
    delivered = _drain(consumer, [{P0: _records(P0, [5, 6, 7])}], into_a_full_queue)
    assert delivered == [(TOKENS, 0, 5), (TOKENS, 0, 6), (TOKENS, 0, 7)]
    assert consumer.loop.run_until_complete(asyncio.wait_for(reading, 5)) == [5, 6, 7]


@pytest.mark.parametrize("lean", [False, True], ids=["fausts_loop", "lean_loop"])
def test_suspending_the_flow_while_a_callback_waits_cancels_it_and_drops_the_rest_of_the_fetch(lean: bool) -> None:
    consumer = _consumer(lean)
    queue: asyncio.Queue[int] = asyncio.Queue(maxsize=1)
    queue.put_nowait(0)  # full: the first put waits
    cancelled: list[int] = []

    def blocked(delivered: list[tuple[str, int, int]]) -> Any:
        async def deliver(message: Any) -> None:
            try:
                await queue.put(message.offset)
            except asyncio.CancelledError:
                cancelled.append(message.offset)
                raise
            delivered.append((message.topic, message.partition, message.offset))
        return deliver

    def suspend_soon() -> None:  # a rebalance begins while the record waits
        consumer.flow_active = False
        consumer.suspend_flow.set()

    consumer.loop.call_later(0.05, suspend_soon)
    delivered = _drain(consumer, [{P0: _records(P0, [5, 6, 7])}], blocked)
    assert delivered == [] and cancelled == [5]  # the suspension won: the put was cancelled
    assert queue.qsize() == 1  # 6 and 7 were not handed over either
    assert consumer._read_offset[P0] == 5  # as Faust does: read, though not delivered (redelivery is the offset guard's)


@pytest.mark.parametrize("lean", [False, True], ids=["fausts_loop", "lean_loop"])
def test_with_the_flow_suspended_a_fetch_delivers_nothing_and_seeks_back(lean: bool) -> None:
    consumer = _consumer(lean)
    seeks: list[int] = []

    async def perform_seek() -> None:
        seeks.append(1)

    consumer.perform_seek = perform_seek
    consumer.flow_active = False
    assert _drain(consumer, [{P0: _records(P0, [5, 6])}]) == [] and seeks == [1]


@pytest.mark.parametrize("lean", [False, True], ids=["fausts_loop", "lean_loop"])
def test_a_new_consumer_generation_ends_the_fetch_at_once(lean: bool) -> None:
    consumer = _consumer(lean)

    def rebalanced(delivered: list[tuple[str, int, int]]) -> Any:
        async def deliver(message: Any) -> None:
            delivered.append((message.topic, message.partition, message.offset))
            consumer.app.consumer_generation_id += 1  # a rebalance completed meanwhile
        return deliver

    assert _drain(consumer, [{P0: _records(P0, [5, 6, 7])}], rebalanced) == [(TOKENS, 0, 5)]


@pytest.mark.parametrize("lean", [False, True], ids=["fausts_loop", "lean_loop"])
def test_an_error_in_the_callback_is_logged_and_raised(lean: bool, caplog: pytest.LogCaptureFixture) -> None:
    consumer = _consumer(lean)

    def failing(delivered: list[tuple[str, int, int]]) -> Any:
        async def deliver(message: Any) -> None:
            raise ValueError("bad")
        return deliver

    with caplog.at_level(logging.ERROR), pytest.raises(ValueError, match="bad"):
        _drain(consumer, [{P0: _records(P0, [5])}], failing)
    assert "Drain messages raised" in caplog.text


def test_the_producer_ebb_waits_by_fausts_method_exactly_when_more_than_max_messages_wait() -> None:
    from entroloop.streams.faust_drain import lean_producer_ebb
    from faust.transport.producer import ProducerBuffer

    async def main() -> list[int]:
        buffer = ProducerBuffer()
        waited: list[int] = []

        async def fausts_wait_until_ebb() -> None:  # stands in for the flush Faust's method does
            waited.append(buffer.pending.qsize())

        buffer.wait_until_ebb = fausts_wait_until_ebb
        lean = lean_producer_ebb(buffer, threaded=False)
        for size in range(buffer.max_messages + 2):
            await lean()
            buffer.pending.put_nowait(size)
        await lean()
        return waited

    assert asyncio.run(main()) == [ProducerBuffer.max_messages + 1, ProducerBuffer.max_messages + 2]


def test_the_conductor_callback_delivers_at_once_when_its_lock_is_free_and_waits_while_a_rebalance_holds_it() -> None:
    from entroloop.streams.app import build_streams_app
    from entroloop.streams.faust_drain import lean_conductor_callback
    from faust.types.tuples import Message

    from entroloop.contract.settings import Settings

    app = build_streams_app(Settings(kafka_bootstrap="127.0.0.1:9", topic_prefix="t.")).app
    conductor = app.topics
    tp = TP("t.x", 0)
    delivered: list[int] = []

    async def handler(message: Message) -> None:
        delivered.append(message.offset)

    async def main() -> list[list[int]]:
        conductor._tp_to_callback[tp] = handler
        on_message = lean_conductor_callback(conductor)
        seen: list[list[int]] = []
        await on_message(Message("t.x", 0, 1, 0.0, 0, None, b"k", b"v", None, tp=tp))
        seen.append(list(delivered))
        await conductor._tp_to_callback_lock.acquire()  # as _update_indices holds it while it rebuilds
        pending = asyncio.ensure_future(on_message(Message("t.x", 0, 2, 0.0, 0, None, b"k", b"v", None, tp=tp)))
        await asyncio.sleep(0.02)
        seen.append(list(delivered))  # not before the handlers are rebuilt
        conductor._tp_to_callback_lock.release()
        await asyncio.wait_for(pending, 1)
        seen.append(list(delivered))
        return seen

    assert app.loop.run_until_complete(main()) == [[1], [1], [1, 2]]
