"""streams/faust_monitor.py and streams/faust_raw.py on the worker's real Faust app (no broker):
the input topics hand over exactly the bytes Faust's ``raw`` codec would, and the trimmed monitor
keeps what Faust itself reads while skipping the per-record statistics."""

from __future__ import annotations

import asyncio

import faust
import pytest
from entroloop.streams.app import StreamsApp, StreamsConfig
from entroloop.streams.faust_monitor import LeanMonitor
from entroloop.streams.faust_raw import RawBytesSchema
from faust.types import TP, Message

from entroloop.contract.records import Feedback
from tests.unit.streams.test_streams_app import Echo


def streams() -> StreamsApp:
    return StreamsApp(StreamsConfig(bootstrap="127.0.0.1:1", topic_prefix="p."), [Echo()])


def message(key: bytes | None, value: bytes | None, offset: int = 7) -> Message:
    return Message("p." + Feedback.topic, 3, offset, 0.0, 0, None, key, value, None,
                   tp=TP("p." + Feedback.topic, 3))


@pytest.mark.parametrize(("key", "value"), [
    (b"req-1", b"\x00\x01binary\xff"),
    (None, b"{}"),
    (b"req-2", b""),
    (b"req-3", None),
])
def test_input_topics_hand_over_the_fetched_bytes_as_the_raw_codec_does(key: bytes | None, value: bytes | None) -> None:
    worker = streams()
    topic = worker._topic(Feedback.topic)
    assert isinstance(topic.schema, RawBytesSchema)
    codec_schema = faust.Schema(key_serializer="raw", value_serializer="raw", allow_empty=True)

    async def both() -> tuple[faust.EventT, faust.EventT]:
        fast = RawBytesSchema()
        fast.allow_empty = True  # so a None value goes through both schemas the same way
        got = await fast.compile(worker.app)(message(key, value), propagate=True)
        want = await codec_schema.compile(worker.app)(message(key, value), propagate=True)
        return got, want

    got, want = asyncio.run(both())
    assert (got.key, got.value) == (want.key, want.value) == (key, value)
    assert type(got.value) is type(want.value)
    assert type(got) is type(want) and got.headers == want.headers and got.message is not None
    assert (got.message.topic, got.message.offset) == (want.message.topic, want.message.offset)


def test_the_workers_monitor_keeps_the_inbound_time_faust_checks_and_skips_per_record_stats() -> None:
    worker = streams()
    monitor = worker.app.monitor
    assert isinstance(monitor, LeanMonitor)
    tp = TP("p." + Feedback.topic, 3)
    before = monitor.stream_inbound_time.get(tp)
    msg = message(b"req-1", b"x")
    monitor.on_message_in(tp, 7, msg)
    state = monitor.on_stream_event_in(tp, 7, object(), object())
    monitor.on_stream_event_out(tp, 7, object(), object(), state)
    monitor.on_message_out(tp, 7, msg)
    # the aiokafka driver's "stream stopped processing" check reads this: it must move
    assert before is None and monitor.stream_inbound_time[tp] > 0
    # nothing per record beyond it
    assert (monitor.messages_received_total, monitor.events_total, len(monitor.events_runtime)) == (0, 0, 0)
    # per-batch hooks are Faust's own (commits are what Faust's commit path reports)
    monitor.on_tp_commit({tp: 8})
    assert monitor.tp_committed_offsets[tp] == 8
