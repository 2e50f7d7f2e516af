"""streams/app.py without a broker: the issue-606 guard, decoding into dead letters, processor errors."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass

import pytest
from entroloop.streams.app import StreamsApp, StreamsConfig, UnsafeConcurrency
from entroloop.streams.base import Processor, derive

from entroloop.contract import codec
from entroloop.contract.ids import NodeStamper
from entroloop.contract.records import Alert, DeadLetter, Event, Feedback, Span
from entroloop.contract.settings import Settings


class Echo(Processor):
    name = "echo"
    inputs = (Feedback,)

    def process(self, record: Event) -> list[Event]:
        if record.request_id == "boom":
            raise RuntimeError("bug")
        return [derive(record, Alert, 0, self.name, alert_key=record.event_id, rule="echo")]


@dataclass
class FakeMessage:
    partition: int
    offset: int
    key: bytes


@dataclass
class FakeEvent:
    message: FakeMessage
    value: bytes


def app(**overrides: object) -> StreamsApp:
    return StreamsApp(StreamsConfig(bootstrap="127.0.0.1:1", topic_prefix="p.", **overrides), [Echo()])  # type: ignore[arg-type]


def test_concurrency_above_one_is_refused_with_the_issue() -> None:
    with pytest.raises(UnsafeConcurrency, match="issues/606"):
        app(concurrency=2)
    assert app(concurrency=2, allow_unsafe_concurrency=True).config.concurrency == 2


def test_one_agent_per_input_topic_with_one_actor() -> None:
    streams = app()
    assert streams.input_topics == [Feedback.topic]
    [agent] = streams.app.agents.values()
    assert agent.concurrency == 1
    assert streams.app.conf.processing_guarantee.value == "at_least_once"


def test_poison_and_wrong_topic_records_become_dead_letters() -> None:
    streams = app()
    stamper = NodeStamper("n")
    good = Feedback(**stamper.stamp(), request_id="r1", rating=1)
    span = Span(**stamper.stamp(), request_id="r2", span_id="s", name="x", start_time=0, end_time=1)
    stale = Feedback(**{**stamper.stamp(), "emitted_at": time.time() - 100 * 86_400}, request_id="r3", rating=1)
    later = Feedback(**stamper.stamp(), request_id="r4", rating=0)
    events = [
        FakeEvent(FakeMessage(0, 10, b"r1"), codec.encode(good)),
        FakeEvent(FakeMessage(0, 11, b"bad"), b"\xc1"),
        FakeEvent(FakeMessage(0, 12, b"r2"), codec.encode(span)),
        FakeEvent(FakeMessage(0, 13, b"r3"), codec.encode(stale)),
        FakeEvent(FakeMessage(0, 14, b"r4"), codec.encode(later)),
    ]
    records, dead = streams._decode_batch(Feedback.topic, Feedback, events)
    assert [(r.event_id, m.offset) for r, m in records] == [(good.event_id, 10), (later.event_id, 14)]
    assert [(d.source_offset, d.error_type) for d in dead] == [
        (11, "malformed"), (12, "wrong_topic"), (13, "out_of_time_window")]
    again = streams.dead_letter(Feedback.topic, 0, 11, b"bad", b"\xc1", codec.MalformedRecord("x"))
    assert again.event_id == dead[0].event_id, "a redelivered poison record gets the same dead-letter id"


def test_a_failing_processor_dead_letters_only_the_failing_record() -> None:
    streams = app()
    stamper = NodeStamper("n")
    ok = Feedback(**stamper.stamp(), request_id="r1", rating=1)
    boom = Feedback(**stamper.stamp(), request_id="boom", rating=1)
    batch = [(ok, FakeMessage(0, 1, b"r1")), (boom, FakeMessage(0, 2, b"boom"))]
    out = streams._run_processors(Feedback.topic, streams.processors, batch)
    alerts = [o for o in out if isinstance(o, Alert)]
    letters = [o for o in out if isinstance(o, DeadLetter)]
    assert [a.alert_key for a in alerts] == [ok.event_id]
    assert len(letters) == 1 and letters[0].error_type == "processor_error" and "bug" in letters[0].reason
    assert codec.decode(letters[0].payload).event_id == boom.event_id


class WhereItRan(Processor):
    """Records which thread ran it; ``blocking`` as the constructor says."""

    inputs = (Feedback,)

    def __init__(self, name: str, blocking: bool) -> None:
        self.name, self.blocking = name, blocking  # type: ignore[misc]
        self.threads: set[str] = set()

    def process(self, record: Event) -> list[Event]:
        self.threads.add(threading.current_thread().name)
        return [derive(record, Alert, 0, self.name, alert_key=record.event_id, rule=self.name)]


def test_fast_processors_run_on_the_event_loop_and_a_blocking_one_on_the_agents_thread() -> None:
    """Through Faust's own agent test context: the batch reaches both processors, the fast one on
    the loop's thread (no hand-off per batch), the blocking one (an embedding model, say) on the
    agent's executor thread, and both outputs are sent."""
    fast, slow = WhereItRan("fast", False), WhereItRan("slow", True)
    streams = StreamsApp(StreamsConfig(bootstrap="127.0.0.1:1", topic_prefix="p.", batch_within_s=0.01), [fast, slow])
    [agent] = streams.app.agents.values()
    sent: list[Event] = []

    async def send(records: list[Event]) -> None:
        sent.extend(records)

    streams._send_all = send  # type: ignore[method-assign]

    async def drive() -> str:
        async with agent.test_context() as running:
            record = Feedback(**NodeStamper("n").stamp(), request_id="r1", rating=1)
            await running.put(codec.encode(record), key=b"r1")
            for _ in range(200):
                if len(sent) == 2:
                    break
                await asyncio.sleep(0.02)
        return threading.current_thread().name

    loop_thread = asyncio.run(drive())
    assert sorted(a.rule for a in sent if isinstance(a, Alert)) == ["fast", "slow"]
    assert fast.threads == {loop_thread}
    assert len(slow.threads) == 1 and slow.threads != {loop_thread} and next(iter(slow.threads)).startswith("proc-")


def test_batches_and_read_ahead_come_from_the_settings() -> None:
    settings = Settings(kafka_bootstrap="127.0.0.1:1", streams_batch_size=123, streams_buffer_records=777)
    config = StreamsConfig.from_settings(settings)
    assert (config.batch_size, config.buffer_records) == (123, 777)
    streams = StreamsApp(config, [Echo()])
    assert streams.app.conf.stream_buffer_maxsize == 777
    assert (Settings().streams_batch_size, Settings().streams_buffer_records) == (2000, 32_768)
