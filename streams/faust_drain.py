"""Faust's consumer loop with a cheaper hand-over of each fetched record, same semantics.

Faust's fetch loop (``Consumer._drain_messages``) takes the records of a fetch from ``getmany``, an
async generator that yields them one at a time in round-robin order (with checks of flow control,
the consumer generation and the partition's high watermark per record), and hands every record to
its stream with ``await self.wait_first(callback(message), self.suspend_flow.wait())``: mode's
``wait_first`` wraps both, and the service's ``stopped`` and ``crashed`` events, in four tasks and
an ``asyncio.wait``, per record. Profiled on the fleet benchmark those were the largest costs of the
worker's event loop. Nearly always the callback (putting the record in the stream's buffer)
finishes without waiting, and then the race is decided before it starts.

``lean_drain_messages`` is that loop with ``getmany`` folded in: the same fetch
(``_wait_next_records``), the same round-robin order, flow, generation and partition checks per
record, the same read-offset and gap bookkeeping, the same seek when flow is not active, the same
yield to the event loop every 100 records and the same handling of a stopped consumer. What it does
not do per record: resume an async generator, build a ``suspend_flow.wait()`` coroutine that is
never awaited, or record the partition's high watermark for Faust's lag monitor (once per partition
per fetch instead, at its first record, where ``getmany`` reads it: a partition revoked later in
the fetch is never asked, aiokafka asserts it is assigned). The callback's first step runs inline: if it
finishes, the record is delivered; if it has to wait (the stream's buffer is full), the partly run
callback continues in a task raced against the flow's suspension by mode's own ``wait_first``,
exactly as before. The transport alone (``entroloop bench workers``' idle processors, 264k fleet
events, six alternating pairs) went from 28.4 to 22.5 µs per event.

Two more per-record costs of that hand-over, each kept to Faust's decision and skipped only where it
is decided without a wait: the conductor's lookup of the partition's handler under its lock
(``lean_conductor_callback``) and the producer buffer's size check behind the settings'
descriptors (``lean_producer_ebb``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any

from faust.transport.consumer import CONSUMER_FETCHING


async def _resume(coro: Coroutine[Any, Any, Any], awaiting: Any) -> Any:
    """Finish ``coro``, suspended after yielding ``awaiting`` (a future, or None for a bare yield)."""
    while True:
        try:
            if awaiting is None:
                await asyncio.sleep(0)
            else:
                await asyncio.wait([awaiting])  # wait for it to finish; its outcome reaches coro below
        except BaseException as exc:  # noqa: BLE001 - cancelled while waiting: cancel coro where it waits, as a Task would
            if awaiting is not None:
                awaiting.cancel()
            try:
                awaiting = coro.throw(exc)
            except StopIteration as stop:
                return stop.value
            continue
        try:
            awaiting = coro.send(None)
        except StopIteration as stop:
            return stop.value


_DONE = object()


def _first_step(delivery: Coroutine[Any, Any, Any]) -> Any:
    """Run a callback's first step: ``_DONE`` when it finished, else what it waits on (a future, or
    None for a bare yield)."""
    try:
        awaiting = delivery.send(None)
    except StopIteration:
        return _DONE
    if awaiting is not None and not asyncio.isfuture(awaiting):
        # asyncio coroutines only ever yield futures or None; anything else cannot be driven here
        delivery.close()
        raise RuntimeError(f"unexpected awaitable yielded by a Faust callback: {awaiting!r}")
    if awaiting is not None:
        awaiting._asyncio_future_blocking = False  # as asyncio.Task does when it takes it
    return awaiting


def lean_drain_messages(consumer: Any) -> Callable[[Any], Coroutine[Any, Any, None]]:
    """``consumer._drain_messages`` (Faust's ``Consumer``), with ``getmany`` folded in and each
    record's callback run inline when it needs no wait (see the module doc). The statements follow
    Faust 0.11-0.15's ``_drain_messages`` and ``getmany`` in order."""
    self = consumer

    async def drain_messages(fetcher: Any) -> None:
        callback = self.callback
        consumer_should_stop = self._stopped.is_set
        fetcher_should_stop = fetcher._stopped.is_set
        read_offsets = self._read_offset
        set_flag, unset_flag = self.diag.set_flag, self.diag.unset_flag
        commit_every = self._commit_every
        app = self.app
        acks_enabled_for = app.topics.acks_enabled_for
        to_message = self._to_message
        highwater = self.highwater
        since_yield = 0
        try:
            while not (consumer_should_stop() or fetcher_should_stop()):
                set_flag(CONSUMER_FETCHING)
                await self.sleep(0)  # Faust sleeps here too: getmany may otherwise never release the loop
                if self.should_stop:
                    continue
                records, active_partitions = await self._wait_next_records(1.0)
                generation_id = app.consumer_generation_id
                if records is None or self.should_stop:
                    unset_flag(CONSUMER_FETCHING)
                    continue
                if not self.flow_active:
                    try:  # as getmany does: seek back to the committed offsets
                        await self.perform_seek()
                    except Exception as ex:  # noqa: BLE001
                        self.log.warning(f"exception performing seek when flow not active {ex}")
                    unset_flag(CONSUMER_FETCHING)
                    continue
                tracked: set[Any] = set()  # partitions whose high watermark the monitor has from this fetch
                track_end_offset = app.monitor.track_tp_end_offset
                for tp, record in self.scheduler.iterate(records):
                    if not self.flow_active or app.consumer_generation_id != generation_id:
                        break
                    if not (active_partitions is None or tp in active_partitions or tp in self._buffered_partitions):
                        continue
                    if tp not in tracked:  # here, as getmany per record: the partition is still assigned
                        tracked.add(tp)
                        track_end_offset(tp, highwater(tp))
                    message = to_message(tp, record)
                    since_yield += 1
                    if since_yield > 100:
                        await asyncio.sleep(0)
                        since_yield = 0
                    offset = message.offset
                    r_offset = read_offsets[tp]
                    if r_offset is None or offset >= r_offset:
                        gap = offset - (r_offset or 0)
                        if gap > 1 and r_offset and acks_enabled_for(message.topic):  # a gap in the offsets
                            await self._add_gap(tp, r_offset + 1, offset)
                        if commit_every is not None and self._n_acked >= commit_every:
                            self._n_acked = 0
                            await self.commit()
                        delivery = callback(message)
                        awaiting = _first_step(delivery)
                        if awaiting is not _DONE:  # the stream's buffer is full: race the suspension as Faust does
                            await self.wait_first(_resume(delivery, awaiting), self.suspend_flow.wait())
                        read_offsets[tp] = offset
                unset_flag(CONSUMER_FETCHING)
        except self.consumer_stopped_errors:
            if self.transport.app.should_stop:  # already stopping
                self.log.info("Broker stopped consumer, shutting down...")
                return
            raise
        except asyncio.CancelledError:
            if self.transport.app.should_stop:
                self.log.info("Consumer shutting down for user cancel.")
                return
            raise
        except Exception:
            self.log.exception("Drain messages raised")
            raise
        finally:
            unset_flag(CONSUMER_FETCHING)

    return drain_messages


def lean_producer_ebb(buffer: Any, threaded: bool) -> Any:
    """``buffer.wait_until_ebb`` (Faust's ``ProducerBuffer``; the conductor awaits it before it
    delivers each fetched record) with the buffer's size read directly: its ``size`` property reads
    ``app.conf.producer_threaded`` through the settings' descriptors per call, fixed for the app's
    life. It waits exactly when Faust's would (more than ``max_messages`` waiting), by Faust's own
    method."""
    wait_until_ebb = buffer.wait_until_ebb

    async def lean_wait_until_ebb() -> None:
        queue = buffer.queue if threaded else buffer.pending  # the threaded queue is set on first use
        if queue is not None and len(queue._queue) > buffer.max_messages:
            await wait_until_ebb()

    return lean_wait_until_ebb


def lean_conductor_callback(conductor: Any) -> Any:
    """The conductor's ``on_message`` (the consumer's callback per fetched record), which looks up
    the record's partition handler under the conductor's ``asyncio.Lock`` (held while a rebalance
    rebuilds the handlers): when the lock is free and nobody waits for it, taking and releasing it
    around a lookup that cannot suspend changes nothing, so the handler is looked up directly;
    otherwise Faust's own ``on_message`` waits its turn. Returns the handler's coroutine itself
    (the drain runs its first step), not one more coroutine around it."""
    lock = conductor._tp_to_callback_lock
    handlers = conductor._tp_to_callback
    on_message = conductor.on_message

    def lean_on_message(message: Any) -> Coroutine[Any, Any, Any]:
        if lock.locked() or lock._waiters:
            return on_message(message)
        return handlers[message.tp](message)

    return lean_on_message


def install_lean_drain(consumer: Any) -> None:
    """Install on one Faust consumer and its app's producer buffer (before the fetcher starts and the
    conductor builds its per-partition handlers, which take ``wait_until_ebb`` when built)."""
    consumer._drain_messages = lean_drain_messages(consumer)
    app = consumer.app
    consumer.callback = lean_conductor_callback(app.topics)
    buffer = app.producer.buffer
    buffer.wait_until_ebb = lean_producer_ebb(buffer, bool(app.conf.producer_threaded))


__all__ = ["install_lean_drain", "lean_conductor_callback", "lean_drain_messages", "lean_producer_ebb"]
