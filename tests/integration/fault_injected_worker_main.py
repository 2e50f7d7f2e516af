"""``entroloop worker`` with faults injected: a Kafka fetcher that fails once, mid-stream, and slow sends.

    python -m tests.integration.fault_injected_worker_main worker [OPTIONS]   (the CLI's own arguments)

After ``ENTROLOOP_TEST_FETCH_FAULT_AFTER`` records were fetched (unset: never), the next call of aiokafka's
``Fetcher.fetched_records`` raises ``KeyError`` (what a seek from the wrong thread raised in CI, from
the same method), once; Faust's Fetcher service then crashes and the worker stops. With
``ENTROLOOP_TEST_SLOW_SEND_S`` every batch waits that long before handing its outputs to the
producer (as behind a full producer buffer), so the stop finds the agents in the middle of batches.
With ``ENTROLOOP_TEST_HANG_STOP=1`` the Kafka consumer's stop never returns (as after the Fetcher
crash that left the stop waiting on a consumer thread that had gone).
"""

from __future__ import annotations

import asyncio
import os

import aiokafka.consumer.fetcher as aiokafka_fetcher
import faust.transport.consumer as faust_consumer
from entroloop.streams.app import StreamsApp

from entroloop.cli import main

FAULT_AFTER = int(os.environ.get("ENTROLOOP_TEST_FETCH_FAULT_AFTER", "-1"))
SLOW_SEND_S = float(os.environ.get("ENTROLOOP_TEST_SLOW_SEND_S", "0"))
HANG_STOP = os.environ.get("ENTROLOOP_TEST_HANG_STOP") == "1"
_fetched_records = aiokafka_fetcher.Fetcher.fetched_records
_send_all = StreamsApp._send_all
_state = {"records": 0, "fired": False}


async def fetched_records_failing_once(self, *args, **kwargs):  # type: ignore[no-untyped-def]
    if FAULT_AFTER >= 0 and not _state["fired"] and _state["records"] >= FAULT_AFTER:
        _state["fired"] = True
        raise KeyError("injected fetcher fault")
    batch = await _fetched_records(self, *args, **kwargs)
    _state["records"] += sum(len(records) for records in batch.values())
    return batch


async def slow_send_all(self, records):  # type: ignore[no-untyped-def]
    await asyncio.sleep(SLOW_SEND_S)
    await _send_all(self, records)


async def hanging_stop(self) -> None:  # type: ignore[no-untyped-def]
    await asyncio.Event().wait()


aiokafka_fetcher.Fetcher.fetched_records = fetched_records_failing_once
if SLOW_SEND_S:
    StreamsApp._send_all = slow_send_all
if HANG_STOP:
    faust_consumer.Consumer.on_stop = hanging_stop

if __name__ == "__main__":
    main()
