"""streams/faust_take.py on the worker app's real Faust objects: its channel queue (mode's
``ThrowableQueue`` with its pressure callbacks), ``Event``/``Message`` acknowledgement through the
app's consumer, the flow control and generation id that decide what Faust skips. Only the broker is
absent. A Faust upgrade that changes what the per-record iterator relies on fails here."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterator
from contextlib import aclosing
from types import SimpleNamespace
from typing import Any

import pytest
from entroloop.streams.app import build_streams_app
from entroloop.streams.faust_fetch import FETCH_MAX_WAIT_MS, shorten_fetch_wait
from entroloop.streams.faust_take import take_batches
from faust.events import Event
from faust.sensors import Sensor
from faust.types import TP
from faust.types.tuples import ConsumerMessage

from entroloop.contract.settings import Settings

TOPIC = "t.entroloop.tokens.v1"


@pytest.fixture
def app() -> Iterator[Any]:
    """The worker's Faust app, its flow resumed as after a partition assignment. Its garbage is
    collected after the test: finalizers left to a later collection ran in the middle of pytest's
    parse of a module and tripped CPython 3.11's "AST constructor recursion depth mismatch"."""
    app = build_streams_app(Settings(kafka_bootstrap="127.0.0.1:9", topic_prefix="t.")).app
    app.flow_control.resume()
    app.topics.acking_topics.add(TOPIC)
    yield app
    del app
    gc.collect()


def _event(app: Any, offset: int, partition: int = 0, generation: int | None = None) -> Any:
    generation = app.consumer_generation_id if generation is None else generation
    message = ConsumerMessage(TOPIC, partition, offset, 0.0, 0, {}, b"k", b"v%d" % offset, None, generation_id=generation)
    message.incref(1)  # one channel delivers it, as the conductor counts
    return Event(app, b"k", message.value, {}, message)


def _run(app: Any, main: Any) -> Any:
    return app.loop.run_until_complete(main())


async def _first_batch_offsets(stream: Any) -> list[int]:
    async with aclosing(take_batches(stream, 10, within=0.01)) as batches:
        async for batch in batches:
            return [event.message.offset for event in batch]
    raise AssertionError("no batch")


def test_a_batch_is_what_the_queue_holds_up_to_max_and_is_acknowledged_only_after_it_is_handed_out(app: Any) -> None:

    async def main() -> list[list[int]]:
        stream = app.channel(maxsize=100).stream()
        events = [_event(app, offset) for offset in range(5)]
        for event in events:
            stream.channel.queue.put_nowait(event)
        taken: list[list[int]] = []
        async with aclosing(take_batches(stream, 3, within=0.05)) as batches:
            async for batch in batches:
                assert not any(event.message.acked for event in batch)  # in hand: not acknowledged
                assert all(event.message in app.consumer.unacked for event in batch)  # tracked
                taken.append([event.message.offset for event in batch])
                if len(taken) == 2:
                    break
        assert all(event.message.acked for event in events)
        assert not app.consumer.unacked
        return taken

    assert _run(app, main) == [[0, 1, 2], [3, 4]]


def test_records_that_arrive_within_the_wait_join_the_batch_and_later_ones_the_next(app: Any) -> None:

    async def main() -> list[list[int]]:
        stream = app.channel(maxsize=100).stream()
        queue = stream.channel.queue
        queue.put_nowait(_event(app, 0))
        loop = asyncio.get_running_loop()
        loop.call_later(0.05, queue.put_nowait, _event(app, 1))  # within 0.3 s of the first
        loop.call_later(0.6, queue.put_nowait, _event(app, 2))  # after the batch was handed out
        taken: list[list[int]] = []
        async with aclosing(take_batches(stream, 10, within=0.3)) as batches:
            async for batch in batches:
                taken.append([event.message.offset for event in batch])
                if len(taken) == 2:
                    break
        return taken

    assert _run(app, main) == [[0, 1], [2]]


def test_a_record_of_an_earlier_generation_is_acknowledged_and_skipped_as_faust_skips_it(app: Any) -> None:

    async def main() -> list[int]:
        stream = app.channel(maxsize=100).stream()
        stale, fresh = _event(app, 7, generation=app.consumer_generation_id - 1), _event(app, 8)
        stream.channel.queue.put_nowait(stale)
        stream.channel.queue.put_nowait(fresh)
        async with aclosing(take_batches(stream, 10, within=0.01)) as batches:
            async for batch in batches:
                assert stale.message.acked and not fresh.message.acked
                return [event.message.offset for event in batch]
        raise AssertionError("no batch")

    assert _run(app, main) == [8]


def test_a_record_delivered_while_flow_is_suspended_is_skipped(app: Any) -> None:

    async def main() -> list[int]:
        stream = app.channel(maxsize=100).stream()
        early = _event(app, 1)
        stream.channel.queue.put_nowait(early)
        app.flow_control.suspend()  # a rebalance began
        batches = take_batches(stream, 10, within=0.01)
        with pytest.raises(TimeoutError):  # nothing to hand out: it waits for the next record
            await asyncio.wait_for(batches.__anext__(), 0.1)
        assert early.message.acked
        app.flow_control.resume()
        late = _event(app, 2)
        stream.channel.queue.put_nowait(late)
        return await _first_batch_offsets(stream)

    assert _run(app, main) == [2]


def test_a_batch_left_by_an_exception_is_still_acknowledged(app: Any) -> None:

    async def main() -> list[Any]:
        stream = app.channel(maxsize=100).stream()
        events = [_event(app, offset) for offset in range(3)]
        for event in events:
            stream.channel.queue.put_nowait(event)
        with pytest.raises(RuntimeError):
            async with aclosing(take_batches(stream, 10, within=0.01)) as batches:
                async for _batch in batches:
                    raise RuntimeError("the agent failed")
        return events

    assert all(event.message.acked for event in _run(app, main))  # as take_events does in its finally


def test_an_error_thrown_into_the_channel_reaches_the_agent(app: Any) -> None:

    async def main() -> None:
        stream = app.channel(maxsize=100).stream()
        queue = stream.channel.queue
        queue.put_nowait(_event(app, 0))
        asyncio.get_running_loop().call_later(0.05, queue._throw, ValueError("thrown"))  # while it waits for more
        async with aclosing(take_batches(stream, 10, within=0.5)) as batches:
            with pytest.raises(ValueError, match="thrown"):
                await batches.__anext__()

    _run(app, main)


def test_emptying_the_queue_resumes_the_partitions_paused_while_it_was_nearly_full(app: Any) -> None:

    async def main() -> tuple[int, list[str]]:
        stream = app.channel(maxsize=10).stream()  # pressure high at 8 records
        queue = stream.channel.queue
        calls: list[str] = []
        for offset in range(9):
            queue.put_nowait_enhanced(_event(app, offset), on_pressure_high=lambda: calls.append("paused"),
                                      on_pressure_drop=lambda: calls.append("resumed"))
        assert calls == ["paused"]
        async with aclosing(take_batches(stream, 100, within=0.5)) as batches:
            async for batch in batches:
                # before the batch is processed, so the fetcher refills while the agent works
                return len(batch), list(calls)
        raise AssertionError("no batch")

    assert _run(app, main) == (9, ["paused", "resumed"])


def test_the_worker_consumer_fetches_with_the_short_long_poll() -> None:
    worker = build_streams_app(Settings(kafka_bootstrap="127.0.0.1:9", topic_prefix="t."))
    thread = worker.app.consumer._thread

    async def main() -> Any:
        return thread._create_worker_consumer(worker.app.transport)

    aio = _run(worker.app, main)
    assert aio._fetch_max_wait_ms == FETCH_MAX_WAIT_MS == 100  # Faust's driver says 1500
    shorten_fetch_wait(worker.app.consumer, 250)
    assert _run(worker.app, main)._fetch_max_wait_ms == 250


def test_a_stream_with_processors_of_its_own_is_taken_by_fausts_iterator_which_runs_them(app: Any) -> None:

    async def main() -> tuple[list[int], list[bytes]]:
        stream = app.channel(maxsize=100).stream()
        seen: list[bytes] = []
        stream.add_processor(lambda value: seen.append(value) or value)
        for offset in range(3):
            await stream.channel.put(_event(app, offset))
        async with aclosing(take_batches(stream, 3, within=0.05)) as batches:
            async for batch in batches:
                return [event.message.offset for event in batch], seen
        raise AssertionError("no batch")

    assert _run(app, main) == ([0, 1, 2], [b"v0", b"v1", b"v2"])


def test_stopping_the_stream_ends_a_wait_for_records(app: Any) -> None:

    async def main() -> list[list[int]]:
        stream = app.channel(maxsize=100).stream()
        taken: list[list[int]] = []

        async def agent() -> None:
            async with aclosing(take_batches(stream, 10, within=0.05)) as batches:
                async for batch in batches:
                    taken.append([event.message.offset for event in batch])

        running = asyncio.ensure_future(agent())
        await stream.channel.put(_event(app, 0))
        await asyncio.sleep(0.2)
        await stream.stop()  # what Faust does when it stops an agent; nothing cancels the agent
        await asyncio.wait_for(running, 2)  # its iteration ended instead of waiting in queue.get()
        return taken

    assert _run(app, main) == [[0]]


def test_the_end_faust_throws_into_the_channel_ends_the_batches_after_the_records_taken(app: Any) -> None:

    async def main() -> list[list[int]]:
        stream = app.channel(maxsize=100).stream()
        first = _event(app, 0)
        stream.channel.queue.put_nowait(first)
        # what faust.agents.actor does when it cancels an actor, while the batch waits for more
        asyncio.get_running_loop().call_later(0.05, stream.channel._throw, StopAsyncIteration())
        taken: list[list[int]] = []
        async with aclosing(take_batches(stream, 10, within=0.5)) as batches:
            async for batch in batches:  # a RuntimeError if StopAsyncIteration escaped the generator
                taken.append([event.message.offset for event in batch])
        assert first.message.acked
        return taken

    assert _run(app, main) == [[0]]


def test_a_second_copy_of_a_record_in_the_same_batch_is_left_out(app: Any) -> None:

    async def main() -> tuple[list[tuple[int, int]], list[Any]]:
        stream = app.channel(maxsize=100).stream()
        first, other, again = _event(app, 5), _event(app, 5, partition=1), _event(app, 5)
        for event in (first, other, again):  # fetched twice: before and after a seek
            stream.channel.queue.put_nowait(event)
        async with aclosing(take_batches(stream, 10, within=0.01)) as batches:
            async for batch in batches:
                assert not again.message.acked  # not before the first copy is processed
                taken = [(event.message.partition, event.message.offset) for event in batch]
                break
        return taken, [first.message.acked, other.message.acked]

    assert _run(app, main) == ([(0, 5), (1, 5)], [True, True])


def test_an_error_thrown_while_records_wait_is_raised_before_they_are_taken(app: Any) -> None:
    # mode's get_nowait raises a thrown error before it pops the next record: taking the records
    # that lie in the queue must not pass over it

    async def main() -> None:
        stream = app.channel(maxsize=100).stream()
        queue = stream.channel.queue
        for offset in range(3):
            queue.put_nowait(_event(app, offset))
        queue._throw(ValueError("thrown"))  # no reader waiting: kept for the next get
        async with aclosing(take_batches(stream, 10, within=0.01)) as batches:
            with pytest.raises(ValueError, match="thrown"):
                await batches.__anext__()
        assert queue.qsize() == 3  # the records stay for whoever reads on

    _run(app, main)


def test_a_record_another_channel_still_holds_is_not_acknowledged_with_the_batch(app: Any) -> None:
    # Message.ack drops one reference per stream; only the last one makes the offset committable

    async def main() -> tuple[list[bool], list[int], bool]:
        stream = app.channel(maxsize=100).stream()
        shared, own = _event(app, 0), _event(app, 1)
        shared.message.incref(1)  # delivered to a second channel too
        for event in (shared, own):
            stream.channel.queue.put_nowait(event)
        async with aclosing(take_batches(stream, 10, within=0.01)) as batches:
            async for _ in batches:
                break
        acked = [shared.message.acked, own.message.acked]
        refs = [shared.message.refcount, own.message.refcount]
        return acked, refs, shared.message in app.consumer.unacked

    assert _run(app, main) == ([False, True], [1, 0], True)


def test_an_error_thrown_into_the_queue_as_the_agent_is_cancelled_is_not_left_unretrieved(app: Any) -> None:
    # Faust stops an agent by throwing StopAsyncIteration into its channel and cancelling it; when
    # both land in one turn of the loop, the error ends the queue read nobody reads any more, and
    # asyncio logged "Task exception was never retrieved" with a traceback in every stopping worker

    async def main() -> list[Any]:
        loop = asyncio.get_running_loop()
        unretrieved: list[Any] = []
        loop.set_exception_handler(lambda _loop, context: unretrieved.append(context.get("exception")))
        stream = app.channel(maxsize=100).stream()

        async def agent() -> None:
            async with aclosing(take_batches(stream, 10, within=0.5)) as batches:
                async for _ in batches:
                    pass

        running = asyncio.ensure_future(agent())
        await asyncio.sleep(0.01)  # it waits for a record
        stream.channel._throw(StopAsyncIteration())
        running.cancel()
        with pytest.raises(asyncio.CancelledError):
            await running
        await asyncio.sleep(0.01)
        gc.collect()  # a task's unretrieved exception is reported when the task is collected
        await asyncio.sleep(0)
        return unretrieved

    assert _run(app, main) == []


def _acknowledged(app: Any, batched: bool) -> tuple[Any, ...]:
    """A batch of every kind of record acknowledged by ``_ack_all`` (batched) or one ``event.ack()``
    at a time (Faust's path), and what the consumer and the sensors recorded."""
    from entroloop.streams.faust_take import _ack_all
    from faust.types.tuples import Message

    consumer = app.consumer
    other = "t.entroloop.audit.v1"  # a topic that is not acknowledged
    consumer._committed_offset[TP(TOPIC, 1)] = 50
    events = [_event(app, 10), _event(app, 11), _event(app, 60, partition=1), _event(app, 12)]
    events.append(_event(app, 40, partition=1))  # behind the committed offset: acked, not recorded
    events.append(_event(app, 11))  # the same offset again: recorded once
    shared = _event(app, 13)
    shared.message.incref(1)  # another channel holds it: not acknowledged yet
    events.append(shared)
    done = _event(app, 14)
    done.message.acked = True  # acknowledged before: skipped
    events.append(done)
    unacked_topic = ConsumerMessage(other, 0, 5, 0.0, 0, {}, b"k", b"v", None)
    unacked_topic.incref(1)
    events.append(Event(app, b"k", b"v", {}, unacked_topic))
    plain = Message(TOPIC, 3, 7, 0.0, 0, {}, b"k", b"v", None)  # not a consumer's message
    plain.incref(1)
    events.append(Event(app, b"k", b"v", {}, plain))
    for event in events:
        if isinstance(event.message, ConsumerMessage) and event.message.topic == TOPIC:
            consumer.track_message(event.message)
    out: list[tuple[Any, int]] = []

    class Recording(Sensor):
        def on_message_out(self, tp: Any, offset: int, message: Any) -> None:
            out.append((tp, offset))

    app.sensors.add(Recording())
    stream = SimpleNamespace(app=app, _on_message_out=app.sensors.on_message_out)
    waiter = consumer._waiting_for_ack = app.loop.create_future()
    if batched:
        _ack_all(stream, events)
    else:
        for event in events:
            if event.ack():
                stream._on_message_out(event.message.tp, event.message.offset, event.message)
    return (out, {tp: list(v) for tp, v in consumer._acked.items()}, consumer._n_acked,
            sorted(m.offset for m in consumer.unacked), [(e.message.acked, e.message.refcount) for e in events],
            waiter.done())


def test_a_batch_is_acknowledged_exactly_as_fausts_event_ack_one_record_at_a_time() -> None:
    outcomes = []
    for batched in (False, True):
        app = build_streams_app(Settings(kafka_bootstrap="127.0.0.1:9", topic_prefix="t.")).app
        app.topics.acking_topics.add(TOPIC)
        outcomes.append(_acknowledged(app, batched))
        del app
        gc.collect()
    fausts, batched = outcomes
    assert batched == fausts
    out, acked, n_acked, unacked, states, woken = batched
    assert [offset for _, offset in out] == [10, 11, 60, 12, 7]  # 7: the plain message, acknowledged but not recorded
    assert acked == {TP(TOPIC, 0): [10, 11, 12], TP(TOPIC, 1): [60]} and n_acked == 4
    # still tracked, as Faust leaves them: the shared one, the second copy of 11, the one acknowledged
    # before, the one behind the committed offset
    assert unacked == [11, 13, 14, 40] and states[6] == (False, 1) and woken


def test_the_sensors_delegate_is_called_per_record_only_when_a_sensor_listens(app: Any) -> None:
    """With only the worker's LeanMonitor (no-ops per record) the delegate's loop is skipped; a
    sensor that does listen is called for every record in and out."""
    from entroloop.streams.faust_monitor import LeanMonitor

    heard: list[tuple[str, int]] = []

    class Listening(Sensor):
        def on_message_in(self, tp: Any, offset: int, message: Any) -> None:
            heard.append(("in", offset))

        def on_message_out(self, tp: Any, offset: int, message: Any) -> None:
            heard.append(("out", offset))

    offsets = iter(range(1, 100))

    async def one_batch() -> list[int]:
        stream = app.channel(maxsize=100).stream()
        for offset in (next(offsets), next(offsets)):
            stream.channel.queue.put_nowait(_event(app, offset))
        return await _first_batch_offsets(stream)

    app.sensors.add(LeanMonitor())
    calls: list[str] = []
    delegate_in, delegate_out = app.sensors.on_message_in, app.sensors.on_message_out
    app.sensors.on_message_in = lambda *args: (calls.append("in"), delegate_in(*args))
    app.sensors.on_message_out = lambda *args: (calls.append("out"), delegate_out(*args))
    assert _run(app, one_batch) == [1, 2] and calls == [] and heard == []
    app.sensors.add(Listening())
    assert _run(app, one_batch) == [3, 4]
    assert heard == [("in", 3), ("in", 4), ("out", 3), ("out", 4)] and calls == ["in", "in", "out", "out"]
