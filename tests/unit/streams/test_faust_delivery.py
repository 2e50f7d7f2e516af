"""DeliveryGuard (entroloop.streams.faust_delivery): a refused output batch stops the commits for good.

The broker half (a worker whose outputs are refused exits, a restarted one delivers them) is
tests/integration/test_worker_delivery_refused_kafka.py.
"""

from __future__ import annotations

import asyncio

from entroloop.streams.faust_delivery import DeliveryGuard


class FakeConsumer:
    def __init__(self) -> None:
        self.committed: list[dict] = []

    async def _commit(self, offsets: dict) -> bool:
        self.committed.append(offsets)
        return True


def test_commits_while_every_answered_batch_was_delivered_and_never_after_a_refusal() -> None:
    async def main() -> tuple[list, list, int]:
        loop = asyncio.get_running_loop()
        guard, consumer, crashes = DeliveryGuard(), FakeConsumer(), []

        async def on_failure(exc: BaseException) -> None:
            crashes.append(exc)

        guard.guard_commit(consumer, on_failure)
        ok, unanswered = loop.create_future(), loop.create_future()
        ok.set_result(None)
        guard.track(ok)
        guard.track(unanswered)  # sent after the flush began: belongs to a later commit
        assert await consumer._commit({"tp": 1}) is True
        refused = loop.create_future()
        refused.set_exception(RuntimeError("MessageSizeTooLargeError"))
        guard.track(refused)
        assert await consumer._commit({"tp": 2}) is False
        unanswered.set_result(None)
        assert await consumer._commit({"tp": 3}) is False  # sticky: later batches do not clear it
        await asyncio.sleep(0)  # the failure callback is scheduled, not awaited inside the commit
        return consumer.committed, crashes, len(guard._pending)

    committed, crashes, pending = asyncio.run(main())
    assert committed == [{"tp": 1}]
    assert len(crashes) == 1 and "MessageSizeTooLarge" in str(crashes[0])


def test_a_cancelled_batch_counts_as_undelivered() -> None:
    async def main() -> BaseException | None:
        guard = DeliveryGuard()
        future = asyncio.get_running_loop().create_future()
        future.cancel()
        guard.track(future)
        return guard.check()

    assert isinstance(asyncio.run(main()), asyncio.CancelledError)


def test_a_hand_over_that_raised_stops_the_commits() -> None:
    async def main() -> tuple[bool, list]:
        guard, consumer = DeliveryGuard(), FakeConsumer()

        async def on_failure(exc: BaseException) -> None:
            pass

        guard.guard_commit(consumer, on_failure)
        guard.fail(TimeoutError("KafkaTimeoutError: buffer full"))
        return await consumer._commit({"tp": 1}), consumer.committed

    assert asyncio.run(main()) == (False, [])
