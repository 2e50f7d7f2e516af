"""No offset commit past an output the broker did not take: the worker's at-least-once, kept when a
delivery fails.

The worker hands its outputs and changelog records to the producer in batches
(``StreamsApp._produce``) and Faust flushes the producer before each offset commit. Flushing waits
for every batch to be answered, but an answer can be a refusal: a broker down for longer than the
producer's delivery timeout, a topic whose ``max.message.bytes`` is below a record, an ACL. Faust
then commits anyway, and the inputs behind the refused outputs are never processed again: the
outputs are lost, with only a log line. A hand-over that raises (aiokafka's ``KafkaTimeoutError``
when its buffer stays full through a long outage) leaves the agent, and Faust acknowledges the
batch in a ``finally``: the same loss, without even a future.

``DeliveryGuard`` keeps each batch's delivery future (and any hand-over that raised) and wraps the
consumer's commit: once any batch has failed, this process commits nothing again and asks the app
to crash, so the worker exits with an error and a restarted one (the supervisor's job) re-reads
from the last commit. Outputs whose inputs were committed had been delivered (their futures were
answered before that commit), so redelivery covers exactly what may be missing; derived event ids
make the repeats idempotent.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

log = logging.getLogger(__name__)


class DeliveryGuard:
    """The delivery futures of the batches handed to the producer since the last commit."""

    def __init__(self) -> None:
        self._pending: list[asyncio.Future[Any]] = []
        self.failure: BaseException | None = None  # the first refusal; sticky for the process

    def track(self, future: asyncio.Future[Any]) -> None:
        self._pending.append(future)

    def fail(self, exc: BaseException) -> None:
        """A batch that could not even be handed over (the producer's buffer stayed full past its
        timeout during an outage): its records are in no future, so the failure is noted here."""
        if self.failure is None:
            self.failure = exc

    def check(self) -> BaseException | None:
        """The first failed delivery, if any batch answered so far failed (then forever after);
        answered batches are forgotten, unanswered ones kept for the next check."""
        if self.failure is None:
            waiting = []
            for future in self._pending:
                if not future.done():
                    waiting.append(future)
                elif future.cancelled():  # not known to be delivered: as good as refused
                    self.failure = asyncio.CancelledError("an output batch was cancelled before its delivery")
                    break
                elif future.exception() is not None:
                    self.failure = future.exception()
                    break
            self._pending = waiting
        return self.failure

    def guard_commit(self, consumer: Any, on_failure: Callable[[BaseException], Awaitable[None]]) -> None:
        """Wrap ``consumer._commit`` (called by Faust after it flushed the producer): with a failed
        delivery it commits nothing and schedules ``on_failure(exc)`` once."""
        faust_commit = consumer._commit
        reported = False

        async def commit_if_delivered(offsets: Any) -> bool:
            nonlocal reported
            failure = self.check()
            if failure is None:
                return await faust_commit(offsets)
            if not reported:
                reported = True
                log.error("an output batch was refused (%r): no offset is committed past it; the worker "
                          "stops so that a restarted one processes those inputs again", failure)
                asyncio.ensure_future(on_failure(failure))
            return False

        consumer._commit = commit_if_delivered


__all__ = ["DeliveryGuard"]
