"""A cheaper hand-over of each fetched record in Faust's consumer loop, same semantics.

Faust's fetch loop (``Consumer._drain_messages``) hands every record to its stream with
``await self.wait_first(callback(message), self.suspend_flow.wait())``: mode's ``wait_first``
wraps both, and the service's ``stopped`` and ``crashed`` events, in four tasks and an
``asyncio.wait``, per record. Profiled on the fleet benchmark that was the largest single cost of
the worker's event loop. Nearly always the callback (putting the record in the stream's buffer)
finishes without waiting, and then the race is decided before it starts.

``eager_wait_first`` runs the callback's first step inline: if it finishes, that is the result
(what ``wait_first`` would return, less the tasks); if it has to wait (the stream's buffer is
full), the partly run callback continues in a task raced against the other awaitables by mode's
own ``wait_first``, exactly as before. Faust ignores ``wait_first``'s result here.

Two more per-record costs of that hand-over, each kept to Faust's decision and skipped only where it
is decided without a wait: the conductor's lookup of the partition's handler under its lock
(``lean_conductor_callback``) and the producer buffer's size check behind the settings'
descriptors (``lean_producer_ebb``). With them (and ``faust_raw``'s decoder) the delivery of a
fetched record to its agent's queue costs ~6 µs instead of ~8 (min of 7 passes of 30,000 records
through the worker app's real conductor, its Cython handler and queue, same process).
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any

from mode.services import WaitResults


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


def eager_wait_first(consumer: Any) -> Any:
    """``consumer.wait_first`` with the callback's first step run inline (see the module doc)."""
    mode_wait_first = consumer.wait_first

    async def wait_first(*coros: Any, timeout: Any = None) -> Any:
        if timeout is not None or len(coros) != 2 or not asyncio.iscoroutine(coros[0]):
            return await mode_wait_first(*coros, timeout=timeout)
        callback, other = coros
        try:
            awaiting = callback.send(None)
        except BaseException as exc:
            if asyncio.iscoroutine(other):
                other.close()  # never started: nothing to cancel
            if isinstance(exc, StopIteration):
                return WaitResults([callback], [exc.value], False)
            raise
        if awaiting is not None and not asyncio.isfuture(awaiting):
            # Not a future (another event loop library): hand it back untouched is impossible,
            # so this cannot be driven here. asyncio coroutines only ever yield futures or None.
            raise RuntimeError(f"unexpected awaitable yielded by a Faust callback: {awaiting!r}")
        if awaiting is not None:
            awaiting._asyncio_future_blocking = False  # as asyncio.Task does when it takes it
        return await mode_wait_first(_resume(callback, awaiting), other)

    return wait_first


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
    otherwise Faust's own ``on_message`` waits its turn."""
    lock = conductor._tp_to_callback_lock
    handlers = conductor._tp_to_callback
    on_message = conductor.on_message

    async def lean_on_message(message: Any) -> Any:
        if lock.locked() or lock._waiters:
            return await on_message(message)
        return await handlers[message.tp](message)

    return lean_on_message


def install_eager_drain(consumer: Any) -> None:
    """Install on one Faust consumer and its app's producer buffer (before the fetcher starts and the
    conductor builds its per-partition handlers, which take ``wait_until_ebb`` when built)."""
    consumer.wait_first = eager_wait_first(consumer)
    app = consumer.app
    consumer.callback = lean_conductor_callback(app.topics)
    buffer = app.producer.buffer
    buffer.wait_until_ebb = lean_producer_ebb(buffer, bool(app.conf.producer_threaded))


__all__ = ["eager_wait_first", "install_eager_drain", "lean_conductor_callback", "lean_producer_ebb"]
