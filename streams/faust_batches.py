"""A batch the agent has taken from Faust is finished before the agent lets a cancellation through.

Faust's ``Stream.take_events`` acknowledges the batch it handed out when the agent leaves it, in a
``finally``: also when the agent is cancelled halfway through the batch. The consumer commits the
acknowledged offsets when it stops, after the agents, so a batch cut short by a stop or by a crash
elsewhere in the worker was committed unprocessed. Found with an injected Fetcher fault
(tests/integration/test_worker_fetcher_crash.py): every agent was cancelled mid-batch and 2 of 49
alerts were never made by this worker or its replacement (the group had committed past their
records). The batch runs as its own task; a cancellation waits for it, then goes on. A batch that
never ends holds the stop, and ``entroloop.streams.stop_watchdog`` ends the process without a commit.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


async def finish_before_cancel(batch: Coroutine[Any, Any, T]) -> T:
    """Run ``batch`` to its end even if the caller is cancelled meanwhile (then re-raise the
    cancellation once it is done). The batch's own exception, or its own cancellation, propagates."""
    task = asyncio.ensure_future(batch)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():  # the batch itself was cancelled: nothing left to finish
                raise
            cancelled = True  # the caller was: keep waiting for the batch
            continue
        if cancelled:
            raise asyncio.CancelledError
        return result


__all__ = ["finish_before_cancel"]
