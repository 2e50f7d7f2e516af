"""Batches taken straight from an agent's channel queue: ``Stream.take_events`` without a step per record.

Faust's ``take_events`` fills its buffer through the stream's per-record iterator: for every record
an ``await sleep(0)``, a context variable, the stream processors (its buffering callback among
them), sensor calls in and out, and a wake-up of the waiting agent. Profiled in ``entroloop bench
workers`` that hand-over was a quarter of the worker's transport. ``take_batches`` reads the
records the fetcher put in the agent's queue as they lie there, and keeps what the iterator does
that the rest of Faust relies on:

- a record of an earlier consumer generation, or one delivered while flow is suspended (a
  rebalance), is skipped and acknowledged, exactly as the iterator skips it;
- each record is tracked as unacknowledged on arrival and acknowledged after the batch was handed
  out (what ``event.ack()`` does, for the whole batch under one hold of Faust's ``ack_lock``),
  also when the caller leaves the batch by an exception or a cancellation (as ``take_events`` does
  in its ``finally``; ``entroloop.streams.faust_batches`` finishes the
  batch before a cancellation gets that far);
- the sensors hear one ``on_stream_event_in``/``out`` per partition per batch (the aiokafka
  driver's slow-processing check reads the inbound time per partition; the worker's
  ``LeanMonitor`` keeps no per-record statistics);
- the queue is read with its own ``get``/``get_nowait`` (or, when those would only pop its head,
  by popping the head: ``_take_nowait``), so an error thrown into the channel is raised to the
  agent (``StopAsyncIteration``, which Faust throws in to end a stream, ends the batches after the
  records already taken) and the pressure-drop callbacks (which resume fetching
  partitions paused while the queue was nearly full) run as the queue drains.

A record whose partition and offset the batch already holds is left out. A restarted worker's
first batch can hold a record twice (seen: a fallback at the same offset 11 records apart, most
likely fetched once before the recovery's seek to the committed offsets and again after it), and a
counting processor that gets both in one batch counts them twice (the aggregates restart test: a
minute's fallbacks 31 of 30 here, 45 in CI; it had passed with the per-record iterator, and why
that never met such a pair in one batch I did not establish). Copies in different batches are the
aggregates snapshots' to skip (``entroloop.streams.aggregate_snapshots``), as redeliveries always were.

What the app's flow control, generation and acknowledged topics say is read once per stretch of
records taken without a wait (``_Admission``): only another task can change them. With the batched
acknowledgement and the direct pops, the hand-over costs 2.1 µs per record instead of 4.8 (min of
7 passes of 60,000 records through the worker app's real queue and consumer, same process).

A batch is yielded when it holds ``max_`` records, or ``within`` seconds after its first record came.
A stream with processors of its own (``Stream.add_processor``: the worker adds none, Faust's agent
test context does) is taken with ``take_events``, since only the per-record iterator runs them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from contextlib import aclosing
from typing import Any

from entroloop.streams.faust_monitor import hears_each_record
from faust.transport.consumer import Consumer
from faust.types.tuples import ConsumerMessage, ack_lock
from mode.utils.futures import notify


class _Admission:
    """What ``accept`` reads from the app, read once per stretch of records taken without a wait.

    Flow control, the consumer generation and the set of acknowledged topics change only in other
    tasks of this event loop (a rebalance), never between two records taken without a wait."""

    __slots__ = ("acking_topics", "flowing", "generation", "message_in", "stream", "unacked")

    def __init__(self, stream: Any) -> None:
        app = stream.app
        self.stream = stream
        self.flowing = app.flow_control.is_active()
        self.generation = app.consumer_generation_id
        self.acking_topics = app.topics.acking_topics
        self.unacked = app.consumer.unacked
        self.message_in = stream._on_message_in if hears_each_record(app.sensors, "on_message_in") else None

    def accept(self, event: Any, batch: list[Any], taken: set[tuple[Any, int]]) -> None:
        """Track ``event``'s message and add it to ``batch``; acknowledge it at once if Faust would
        skip it. A second copy of a record the batch holds is left out unacknowledged: the first
        copy's acknowledgement, after the batch, covers the offset (acknowledging it now could let a
        commit pass the offset before the first copy's outputs are sent)."""
        message = event.message
        if not self.flowing or message.generation_id != self.generation:
            # The iterator's rule: from before a rebalance; acknowledged, not handed out (faust_offsets
            # guards the commits against acknowledged-but-unprocessed heads).
            if event.ack():
                self.stream._on_message_out(message.tp, message.offset, message)
            return
        position = (message.tp, message.offset)
        if position in taken:
            return
        taken.add(position)
        if message.topic in self.acking_topics and not message.tracked:
            message.tracked = True  # Consumer.track_message, as the iterator inlines it
            self.unacked.add(message)
            if self.message_in is not None:
                self.message_in(message.tp, message.offset, message)
        batch.append(event)


def _take_nowait(queue: Any, most: int) -> Iterator[Any]:
    """What ``most`` calls of ``queue.get_nowait()`` (mode's ``ThrowableQueue``) return, as far as
    the queue holds records. When no error waits to be raised, no pressure-drop callback waits to
    run and no producer waits for room, each such call only pops the queue's head, so the head is
    popped directly (a fifth of the hand-over's cost per record); otherwise the queue's own
    ``get_nowait`` does its bookkeeping record by record."""
    count = min(most, queue.qsize())
    if queue._errors or queue._pending_pressure_drop_callbacks or queue._putters:
        for _ in range(count):
            yield queue.get_nowait()
        return
    popleft = queue._queue.popleft
    for _ in range(count):
        yield popleft()


def _unheard(tp: Any, offset: int, message: Any) -> None:
    """The sensors' ``on_message_out`` when none of them does anything per record."""


def _ack_all(stream: Any, batch: list[Any]) -> None:
    """``event.ack()`` of every event of ``batch`` (and the sensors' ``on_message_out`` of each
    message whose offset that made committable), under one hold of Faust's ``ack_lock``: per event,
    what ``Event.ack`` -> ``Message.ack`` -> ``ConsumerMessage.on_final_ack`` -> ``Consumer.ack``
    does (one reference dropped; at none left, the offset recorded as acknowledged), with that
    chain's four calls and lock holds per record made once per batch: whether a topic is
    acknowledged is asked once per topic, the acknowledgement counter is added to and its waiter
    woken once (nothing else runs before this returns). A consumer or message whose ``ack`` is not
    Faust's gets its own, record by record."""
    consumer = stream.app.consumer
    message_out = stream._on_message_out if hears_each_record(stream.app.sensors, "on_message_out") else _unheard
    if getattr(consumer.ack, "__func__", None) is not Consumer.ack:
        with ack_lock:
            for event in batch:
                if event.ack():
                    message = event.message
                    message_out(message.tp, message.offset, message)
        return
    acks_enabled_for = consumer.app.topics.acks_enabled_for
    committed_offsets, acked_index, acked = consumer._committed_offset, consumer._acked_index, consumer._acked
    unacked = consumer._unacked_messages
    acking: dict[str, bool] = {}
    newly_acked = 0
    touched = False  # Consumer.ack wakes its waiter after every message of an acknowledged topic
    with ack_lock:
        try:
            for event in batch:
                message = event.message
                if message.acked:
                    continue
                message.refcount = refcount = max(message.refcount - 1, 0)
                if refcount:
                    continue
                if type(message) is not ConsumerMessage:
                    if message.on_final_ack(consumer):
                        message_out(message.tp, message.offset, message)
                    continue
                message.acked = True
                topic = message.topic
                enabled = acking.get(topic)
                if enabled is None:
                    enabled = acking[topic] = acks_enabled_for(topic)
                if not enabled:
                    continue
                touched = True
                tp, offset = message.tp, message.offset
                committed = committed_offsets[tp]
                if committed is None or offset >= committed:
                    index = acked_index[tp]
                    if offset not in index:
                        unacked.discard(message)
                        index.add(offset)
                        acked[tp].append(offset)
                        newly_acked += 1
                        message_out(tp, offset, message)
        finally:
            consumer._n_acked += newly_acked
            if touched:
                notify(consumer._waiting_for_ack)


def _seen(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


async def _next_event(stream: Any, queue: Any, timeout: float | None) -> Any:
    """The queue's next event; None when ``timeout`` passes or the stream stops first (Faust stops
    an agent's stream and waits for its iteration to end: a bare ``queue.get()`` would hold it)."""
    getter = asyncio.ensure_future(queue.get())
    # An error thrown into the queue in the same turn as the agent's cancellation (how Faust stops
    # an agent) ends this read after nobody waits for it: marked as seen, or asyncio logs it with a
    # traceback when the task is collected. When this returns, the result below still raises it.
    getter.add_done_callback(_seen)
    stopped = asyncio.ensure_future(stream._stopped.wait())
    try:
        await asyncio.wait((getter, stopped), timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        pending = [task for task in (getter, stopped) if not task.done()]
        for task in pending:
            task.cancel()  # asyncio.Queue.get leaves its item in the queue when cancelled
        if pending:  # ended before this returns: no task left pending to be destroyed at exit
            await asyncio.wait(pending)
    return getter.result() if getter.done() and not getter.cancelled() else None  # raises a thrown error


async def take_batches(stream: Any, max_: int, within: float) -> AsyncIterator[list[Any]]:
    """Lists of at most ``max_`` events of ``stream``'s channel, acknowledged after each is handed out."""
    if stream._processors:  # only the per-record iterator runs them (Faust's agent test context adds one)
        async with aclosing(stream.take_events(max_, within=within)) as taken:
            async for batch in taken:
                yield batch
        return
    queue = stream.channel.queue
    loop = asyncio.get_running_loop()
    while not stream.should_stop:
        batch: list[Any] = []
        taken: set[tuple[Any, int]] = set()  # (partition, offset) in the batch
        deadline = None  # set by the batch's first record
        ended = False
        try:
            while len(batch) < max_:
                if queue.qsize():  # what lies in the queue, without a wait
                    admission = _Admission(stream)
                    for event in _take_nowait(queue, max_ - len(batch)):
                        admission.accept(event, batch, taken)
                else:
                    remaining = None if deadline is None else deadline - loop.time()
                    if (remaining is not None and remaining <= 0) or stream.should_stop:
                        break
                    event = await _next_event(stream, queue, remaining)
                    if event is None:
                        break
                    _Admission(stream).accept(event, batch, taken)
                if deadline is None:
                    deadline = loop.time() + within
        except StopAsyncIteration:  # thrown into the channel when Faust stops it: the iterator ends there
            ended = True
        if not batch:  # stopped, ended, or all skipped
            if ended:
                return
            continue
        newest = {event.message.tp: event for event in batch}  # each partition's last event, for the sensors
        states = {tp: stream._on_stream_event_in(tp, event.message.offset, stream, event)
                  for tp, event in newest.items()}
        try:
            yield batch
        finally:
            _ack_all(stream, batch)
            for tp, event in newest.items():
                stream._on_stream_event_out(tp, event.message.offset, stream, event, states[tp])
        if ended:
            return


__all__ = ["take_batches"]
