"""streams/faust_drain.py on mode's real ``Service.wait_first``: a callback that finishes at once
is done inline, one that waits still races the flow-suspension event exactly as before."""

from __future__ import annotations

import asyncio

from entroloop.streams.faust_drain import eager_wait_first
from mode import Service


class Consumer(Service):
    """A mode service, like Faust's consumer: ``wait_first`` is mode's."""


def run(main):  # type: ignore[no-untyped-def]
    return asyncio.run(main())


def test_a_callback_that_does_not_wait_runs_inline_and_the_other_is_never_started() -> None:
    async def main() -> None:
        consumer = Consumer()
        wait_first = eager_wait_first(consumer)
        seen: list[int] = []
        suspend = asyncio.Event()

        async def callback(n: int) -> int:
            seen.append(n)
            return n * 2

        tasks_before = len(asyncio.all_tasks())
        result = await wait_first(callback(21), suspend.wait())
        assert seen == [21] and result.results == [42] and not result.stopped
        assert len(asyncio.all_tasks()) == tasks_before  # no task was made

    run(main)


def test_a_callback_that_waits_finishes_later_with_its_result() -> None:
    async def main() -> None:
        consumer = Consumer()
        wait_first = eager_wait_first(consumer)
        queue: asyncio.Queue[int] = asyncio.Queue(maxsize=1)
        queue.put_nowait(0)  # full: the callback's put has to wait
        suspend = asyncio.Event()

        async def callback() -> str:
            await queue.put(1)
            await asyncio.sleep(0)  # a bare yield too
            return "delivered"

        pending = asyncio.ensure_future(wait_first(callback(), suspend.wait()))
        await asyncio.sleep(0.01)
        assert not pending.done()
        assert queue.get_nowait() == 0  # room: the put goes through
        result = await asyncio.wait_for(pending, 1)
        assert result.results == ["delivered"] and queue.get_nowait() == 1

    run(main)


def test_suspending_the_flow_while_a_callback_waits_cancels_it_as_before() -> None:
    async def main() -> None:
        consumer = Consumer()
        wait_first = eager_wait_first(consumer)
        queue: asyncio.Queue[int] = asyncio.Queue(maxsize=1)
        queue.put_nowait(0)
        suspend = asyncio.Event()
        cancelled: list[bool] = []

        async def callback() -> None:
            try:
                await queue.put(1)
            except asyncio.CancelledError:
                cancelled.append(True)
                raise

        pending = asyncio.ensure_future(wait_first(callback(), suspend.wait()))
        await asyncio.sleep(0.01)
        suspend.set()
        result = await asyncio.wait_for(pending, 1)
        await asyncio.sleep(0.01)
        assert result.results == [True] and cancelled == [True]  # the suspension won, the put was cancelled
        assert queue.qsize() == 1 and queue.get_nowait() == 0  # the record never went in

    run(main)


def test_an_error_in_the_callback_propagates() -> None:
    async def main() -> None:
        wait_first = eager_wait_first(Consumer())

        async def callback() -> None:
            raise ValueError("bad")

        try:
            await wait_first(callback(), asyncio.Event().wait())
        except ValueError as exc:
            assert str(exc) == "bad"
        else:
            raise AssertionError("no error")

    run(main)


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

    assert run(main) == [ProducerBuffer.max_messages + 1, ProducerBuffer.max_messages + 2]


def test_the_conductor_callback_delivers_at_once_when_its_lock_is_free_and_waits_while_a_rebalance_holds_it() -> None:
    from entroloop.streams.app import build_streams_app
    from entroloop.streams.faust_drain import lean_conductor_callback
    from faust.types import TP
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
