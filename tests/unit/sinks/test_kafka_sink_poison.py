"""The Kafka ClickHouse sink with a record ClickHouse refuses: the rest of the range is stored, the
record becomes a dead letter (``insert_rejected``, ClickHouse's error as the reason) delivered before
the offset past it is committed, and the partition goes on (issue 12, finding 4). In-memory consumer
and producer (tests/unit/sinks/test_kafka_sink_consumer.py), real ClickHouseSink on chDB."""

from __future__ import annotations

import msgspec
from confluent_kafka import TopicPartition
from entroloop.collectors.synthetic_fleet import SyntheticFleet
from entroloop.sinks.clickhouse.writer import ClickHouseSink
from entroloop.sinks.kafka_sink import KafkaSinkConsumer, PrefixedClickHouseTarget

from entroloop.contract import codec
from entroloop.contract.records import DeadLetter, TokenEntropy
from entroloop.contract.settings import Settings
from tests.unit.sinks.test_kafka_sink_consumer import (
    KTOPIC,
    PREFIX,
    TOPIC,
    FakeConsumer,
    FakeProducer,
    messages,
)


def _sink(target) -> tuple[KafkaSinkConsumer, FakeConsumer, FakeProducer]:
    settings = Settings(kafka_bootstrap="127.0.0.1:1", topic_prefix=PREFIX)
    consumer, producer = FakeConsumer(), FakeProducer()
    sink = KafkaSinkConsumer("clickhouse", target, [TOPIC], settings, max_rows=1000, max_seconds=60)
    sink.consumer, sink.producer = consumer, producer
    sink._on_assign(consumer, [TopicPartition(KTOPIC, 0)])
    return sink, consumer, producer


def test_a_refused_record_is_dead_lettered_and_the_rest_of_the_range_stored(chdb_client, ch_database):
    clickhouse = ClickHouseSink(chdb_client, ch_database)
    chdb_client.command(f"ALTER TABLE {ch_database}.token_entropy ADD CONSTRAINT no_blocked CHECK request_id != 'blocked'")
    records = [r for q in SyntheticFleet(seed=8).requests(80) for r in q.records if isinstance(r, TokenEntropy)][:60]
    records[23] = msgspec.structs.replace(records[23], request_id="blocked")
    sink, consumer, producer = _sink(PrefixedClickHouseTarget(clickhouse, PREFIX))

    sink._take(messages([codec.encode(r) for r in records], 0))
    sink._flush(force=True)

    assert clickhouse.count("token_entropy") == 59
    letters = [codec.decode(v) for t, v in producer.produced]
    assert [t for t, _ in producer.produced] == [PREFIX + DeadLetter.topic]
    letter = letters[0]
    assert (letter.source_offset, letter.error_type) == (23, "insert_rejected")
    assert "no_blocked" in letter.reason and "ClickHouse refused" in letter.reason
    assert producer.flushes >= 1  # delivered before the commit past it
    assert consumer.committed_offsets[(KTOPIC, 0)] == (60, "")
    assert sink.stats.rows_written == 59
