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


def install_eager_drain(consumer: Any) -> None:
    """Install on one Faust consumer (before its fetcher starts)."""
    consumer.wait_first = eager_wait_first(consumer)


__all__ = ["eager_wait_first", "install_eager_drain"]
