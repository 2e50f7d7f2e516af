"""finish_before_cancel: a batch taken from Faust ends before a cancellation leaves the agent
(Faust acknowledges the batch when the agent leaves it, so an unfinished batch would be committed)."""

from __future__ import annotations

import asyncio

import pytest
from entroloop.streams.faust_batches import finish_before_cancel


async def _batch(done: list[str], seconds: float = 0.05) -> str:
    await asyncio.sleep(seconds)
    done.append("batch")
    return "outputs sent"


def test_returns_the_batch_result() -> None:
    done: list[str] = []
    assert asyncio.run(finish_before_cancel(_batch(done))) == "outputs sent"
    assert done == ["batch"]


@pytest.mark.parametrize("cancels", [1, 3])
def test_a_cancelled_agent_finishes_its_batch_first_then_is_cancelled(cancels: int) -> None:
    done: list[str] = []

    async def main() -> None:
        agent = asyncio.ensure_future(finish_before_cancel(_batch(done, 0.1)))
        for _ in range(cancels):  # mode cancels a stopping service's tasks, possibly more than once
            await asyncio.sleep(0.01)
            agent.cancel()
        with pytest.raises(asyncio.CancelledError):
            await agent
        done.append("agent left")

    asyncio.run(main())
    assert done == ["batch", "agent left"]


def test_the_batch_error_propagates() -> None:
    async def failing() -> None:
        await asyncio.sleep(0)
        raise RuntimeError("producer refused")

    with pytest.raises(RuntimeError, match="producer refused"):
        asyncio.run(finish_before_cancel(failing()))


def test_a_batch_cancelled_from_within_ends_the_agent_without_waiting() -> None:
    async def cancelled_batch() -> None:
        raise asyncio.CancelledError

    async def main() -> None:
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(finish_before_cancel(cancelled_batch()), timeout=5)

    asyncio.run(main())
