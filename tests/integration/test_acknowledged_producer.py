"""The tests' input producer retries a record whose delivery failed instead of losing it silently."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import Consumer

from entroloop.infra.kafka_topics import create_missing_topics
from tests.integration.acknowledged_producer import AcknowledgedProducer

pytestmark = pytest.mark.kafka


def test_a_record_for_a_topic_created_late_is_produced_again_and_acknowledged(
    kafka_bootstrap: str, topic_prefix: str
) -> None:
    """librdkafka fails records for a topic its metadata lacks (here: created 1.5 s after producing,
    with auto-creation off and a 0.2 s wait). A bare ``flush() == 0`` passed with the records lost."""
    topic = topic_prefix + "late"
    producer = AcknowledgedProducer({"bootstrap.servers": kafka_bootstrap, "allow.auto.create.topics": False,
                                     "topic.metadata.propagation.max.ms": 200, "message.timeout.ms": 5000})
    for i in range(10):
        producer.produce(topic, f"value-{i}".encode(), f"key-{i}".encode())
    creator = threading.Timer(1.5, create_missing_topics, args=(kafka_bootstrap, {topic: (1, {})}))
    creator.start()
    try:
        assert producer.flush(60) == 0, producer.last_error
    finally:
        creator.join()
    assert producer.retried >= 10 and producer.last_error is not None
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": f"check-{time.time_ns()}",
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    values: set[bytes] = set()
    deadline = time.monotonic() + 30
    try:
        while len(values) < 10 and time.monotonic() < deadline:
            values |= {m.value() for m in consumer.consume(100, timeout=0.5) if m.error() is None}
    finally:
        consumer.close()
    assert values == {f"value-{i}".encode() for i in range(10)}
