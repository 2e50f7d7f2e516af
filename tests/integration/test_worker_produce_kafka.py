"""The worker's batched hand-over to the producer (``StreamsApp._produce``) against the real broker:
every record arrives, in order within its partition, keyed records on the partition the per-record
``send`` chose (Java's murmur2, checked here against librdkafka's own implementation), explicit
partitions (changelog records) kept, and a batch larger than one producer batch split, not lost."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from entroloop.streams.app import StreamsApp, StreamsConfig

from entroloop.infra.kafka_topics import create_missing_topics
from tests.unit.streams.test_streams_app import Echo

pytestmark = pytest.mark.kafka

PARTITIONS = 6


def _read_all(bootstrap: str, topic: str, expected: int) -> list[tuple[int, bytes, bytes]]:
    """(partition, key, value) of every record of ``topic``, in offset order per partition."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"produce-{time.time_ns()}",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
    got: list[tuple[int, bytes, bytes]] = []
    deadline = time.monotonic() + 60
    while len(got) < expected and time.monotonic() < deadline:
        for message in consumer.consume(1000, timeout=0.5):
            if message.error() is None:
                got.append((message.partition(), message.key(), message.value()))
    consumer.close()
    return got


def _murmur2_partitions(bootstrap: str, topic: str, keys: list[bytes]) -> dict[bytes, int]:
    """The partition librdkafka's Java-compatible partitioner gives each key (an independent murmur2)."""
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})
    chosen: dict[bytes, int] = {}
    for key in keys:
        producer.produce(topic, b"", key, on_delivery=lambda err, msg: chosen.__setitem__(msg.key(), msg.partition()))
    assert producer.flush(30) == 0
    return chosen


def test_batched_produce_delivers_everything_in_partition_order_on_the_per_record_partitions(
        kafka_bootstrap: str, topic_prefix: str) -> None:
    outputs, changelog, control = (topic_prefix + name for name in ("outputs", "changelog", "control"))
    create_missing_topics(kafka_bootstrap, {name: (PARTITIONS, {}) for name in (outputs, changelog, control)})
    streams = StreamsApp(StreamsConfig(bootstrap=kafka_bootstrap, topic_prefix=topic_prefix), [Echo()])
    keys = [f"req-{i}".encode() for i in range(60)]
    keyed = [(outputs, keys[i % len(keys)], f"{i}".encode(), None) for i in range(3000)]
    # 12 records of 300 KB to one partition: several producer batches (1 MiB each)
    explicit = [(changelog, b"state-key", bytes([i]) * 300_000, 4) for i in range(12)]

    async def main() -> None:
        producer = streams.app.producer
        await producer.start()
        try:
            await streams._produce(keyed[:1500] + explicit[:6])
            await streams._produce(keyed[1500:] + explicit[6:])
            await producer.flush()
        finally:
            # the aiokafka producer itself: Faust's service stop waits on the app's other services,
            # which this test never starts
            await producer._ensure_producer().stop()

    asyncio.run(main())
    assert streams.counts["send_errors"] == 0

    got = _read_all(kafka_bootstrap, outputs, len(keyed))
    assert sorted(int(v) for _, _, v in got) == list(range(3000))  # each once
    by_key: dict[bytes, list[int]] = defaultdict(list)
    partition_of: dict[bytes, set[int]] = defaultdict(set)
    for partition, key, value in got:
        by_key[key].append(int(value))
        partition_of[key].add(partition)
    assert all(values == sorted(values) for values in by_key.values())  # in order within a partition
    expected = _murmur2_partitions(kafka_bootstrap, control, keys)
    assert {key: parts for key, parts in partition_of.items()} == {key: {expected[key]} for key in keys}

    states = _read_all(kafka_bootstrap, changelog, len(explicit))
    assert [(p, v[0], len(v)) for p, _, v in states] == [(4, i, 300_000) for i in range(12)]


def test_an_output_over_the_request_size_becomes_a_dead_letter_and_the_rest_is_delivered(
        kafka_bootstrap: str, topic_prefix: str) -> None:
    """A bad case joins an answer and a correction of up to a record's limit each, so an output can
    outgrow what any broker takes; sent, its refusal would stop the commits for good."""
    from entroloop.contract.codec import decode, encode
    from entroloop.contract.ids import NodeStamper
    from entroloop.contract.records import Alert, DeadLetter

    alerts, dead = topic_prefix + Alert.topic, topic_prefix + DeadLetter.topic
    create_missing_topics(kafka_bootstrap, {name: (PARTITIONS, {}) for name in (alerts, dead)})
    streams = StreamsApp(StreamsConfig(bootstrap=kafka_bootstrap, topic_prefix=topic_prefix), [Echo()])
    limit = streams.app.conf.producer_max_request_size
    stamper = NodeStamper("node-big")
    small = Alert(**stamper.stamp(), request_id="small", alert_key="small", rule="echo")
    # over the producer's limit and the broker's message.max.bytes default (1,048,588): sent, it is refused
    big = Alert(**stamper.stamp(), request_id="big", alert_key="big", rule="echo", detail="x" * (max(limit, 1_048_588) + 10))
    big_bytes = encode(big)

    async def main() -> None:
        producer = streams.app.producer
        await producer.start()
        try:
            await streams._send_all([small, big])
            await producer.flush()
        finally:
            await producer._ensure_producer().stop()

    asyncio.run(main())
    assert streams.counts["send_errors"] == 0 and streams.deliveries.check() is None
    assert streams.counts["oversized_outputs"] == 1
    assert [decode(v).request_id for _, _, v in _read_all(kafka_bootstrap, alerts, 1)] == ["small"]
    [(_, key, value)] = _read_all(kafka_bootstrap, dead, 1)
    letter = decode(value)
    assert isinstance(letter, DeadLetter) and key == b"big" and letter.error_type == "too_large"
    assert letter.payload_size == len(big_bytes) and letter.payload == big_bytes[:4096]
    assert letter.source_topic == Alert.topic and str(limit) in letter.reason
