"""What could stall a Kafka sink for good: a ClickHouse outage under a trickle of rows, a poison
record whose dead letter the producer cannot take. In-memory consumer (test_kafka_sink_consumer's
fakes); both failed before their fixes (found in a crash/poison review)."""
from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from entroloop.sinks.kafka_sink import KafkaSinkConsumer

from entroloop.contract.settings import Settings
from tests.unit.sinks.test_kafka_sink_consumer import (
    KTOPIC,
    PREFIX,
    TOPIC,
    FakeConsumer,
    FakeMessage,
    FakeProducer,
    SlicesTarget,
    messages,
    tokens,
)


def test_a_clickhouse_outage_with_trickling_rows_does_not_stall_the_sink_after_recovery() -> None:
    """A failed write is retried with the same cut. Before: every retry re-cut the buffer (new rows
    included) and journaled one more batch per partition; the chain outgrew JOURNAL_MAX_CHARS,
    prepare() raised JournalMismatch on every later flush and nothing was written again, even
    once ClickHouse was back."""
    parts = tuple(range(20))
    settings = Settings(kafka_bootstrap="127.0.0.1:1", topic_prefix=PREFIX)
    consumer = FakeConsumer()
    target = SlicesTarget(consumer)
    sink = KafkaSinkConsumer("test", target, [TOPIC], settings, max_rows=1000, max_seconds=0.0)
    sink.consumer = consumer
    sink.producer = FakeProducer()
    sink._on_assign(consumer, [TopicPartition(KTOPIC, p) for p in parts])
    values = tokens(20 * 12)
    target.fail = True  # ClickHouse down for a dozen retries while one row a partition trickles in
    for rnd in range(12):
        for p in parts:
            sink._take([FakeMessage(1_000_000 + rnd, values[rnd * 20 + p], p)])
        sink._batcher.flush_due(force=True)
    target.fail = False  # ClickHouse is back
    for _ in range(3):
        sink._flush(force=True)
    assert target.batches, f"nothing written after recovery: {sink._batcher.last_error}"
    assert all(consumer.committed_offsets[(KTOPIC, p)][0] == 1_000_012 for p in parts)


class LimitedProducer(FakeProducer):
    """Refuses what librdkafka's produce() refuses synchronously with its default message.max.bytes
    (checked: the real Producer raises KafkaException MSG_SIZE_TOO_LARGE for this dead letter)."""

    def produce(self, topic: str, key: bytes, value: bytes, on_delivery=None) -> None:
        if len(key) + len(value) > 1_000_000:
            raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
        super().produce(topic, key, value, on_delivery)


def test_a_poison_message_with_a_large_key_is_dead_lettered_not_a_crash() -> None:
    """A message the broker accepted (600 KB key of invalid UTF-8, 4-byte value). Before: its dead
    letter's key and request_id were 1.8 MB each (U+FFFD is 3 bytes), the real producer refused it
    synchronously (MSG_SIZE_TOO_LARGE), the exception escaped _take and the sink died at this
    offset on every restart. The dead letter now keeps the key's first 1,024 characters."""
    settings = Settings(kafka_bootstrap="127.0.0.1:1", topic_prefix=PREFIX)
    consumer = FakeConsumer()
    sink = KafkaSinkConsumer("test", SlicesTarget(consumer), [TOPIC], settings, max_rows=1000, max_seconds=60)
    sink.consumer, sink.producer = consumer, LimitedProducer()
    sink._on_assign(consumer, [TopicPartition(KTOPIC, 0)])

    class BigKey(FakeMessage):
        def key(self) -> bytes:
            return b"\xff" * 600_000

    good = messages(tokens(2), 1)
    sink._take([BigKey(0, b"junk"), *good])  # must not raise
    sink._flush(force=True)
    assert consumer.committed_offsets[(KTOPIC, 0)][0] == 3
