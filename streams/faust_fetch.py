"""A shorter long poll for the worker's fetches, so a quiet partition cannot hold back a busy one.

aiokafka keeps at most one fetch request in flight per broker, and a partition whose fetched records
the worker has not consumed yet is left out of the next request. Faust's driver builds its consumer
with ``fetch_max_wait_ms=1500``: a request that happens to name only partitions with nothing new
(an input topic already drained, say) waits at the broker for 1.5 s, and every partition on that
broker that does have records waits with it. Measured in ``entroloop bench workers``: the worker
idled ~1 s at a time, several times per run, with both of its event loops asleep (py-spy) while
tens of thousands of records lay on the broker. With 100 ms the stall is bounded by 100 ms; an
idle worker pays ten small fetch requests a second per broker.
"""

from __future__ import annotations

from typing import Any

FETCH_MAX_WAIT_MS = 100
"""The broker's longest wait for new records before it answers a fetch (aiokafka ``fetch_max_wait_ms``)."""


def shorten_fetch_wait(consumer: Any, max_wait_ms: int = FETCH_MAX_WAIT_MS) -> None:
    """Make the aiokafka consumer that ``consumer`` (Faust's) creates at start fetch with ``max_wait_ms``.

    Faust's driver hard-codes the setting (no app option reaches it); the aiokafka consumer reads it
    when it starts its fetcher, so it is set on the consumer right after Faust creates it."""
    thread = consumer._thread
    create = thread._create_worker_consumer

    def create_worker_consumer(transport: Any) -> Any:
        aio = create(transport)
        aio._fetch_max_wait_ms = max_wait_ms
        return aio

    thread._create_worker_consumer = create_worker_consumer


__all__ = ["FETCH_MAX_WAIT_MS", "shorten_fetch_wait"]
