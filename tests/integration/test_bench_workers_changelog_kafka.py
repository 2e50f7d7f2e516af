"""`bench workers` reads the worker's table changelogs on a real broker: every record of every
changelog topic of the run counted with its key and value bytes, and nothing else of the run."""

from __future__ import annotations

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from entroloop.benchmarks.workers import _changelog_usage


def test_changelog_usage_counts_every_changelog_record_and_its_bytes(kafka_bootstrap: str, topic_prefix: str) -> None:
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    names = [f"{topic_prefix}app-bad_case_join-changelog", f"{topic_prefix}app-entropy_carry-changelog",
             f"{topic_prefix}entroloop.audit.v1"]
    for future in admin.create_topics([NewTopic(name, num_partitions=3, replication_factor=1) for name in names]).values():
        future.result(timeout=30)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    expected_records = expected_bytes = 0
    for i in range(500):
        key, value = f"request-{i}".encode(), b"x" * (i % 37) if i % 10 else None  # tombstones count, 0 bytes of value
        producer.produce(names[i % 2], key=key, value=value, partition=i % 3)
        expected_records += 1
        expected_bytes += len(key) + len(value or b"")
    for i in range(50):  # an input topic of the same run: not a changelog
        producer.produce(names[2], key=b"k", value=b"v" * 100, partition=i % 3)
    assert producer.flush(30) == 0

    assert _changelog_usage(kafka_bootstrap, topic_prefix) == (expected_records, expected_bytes)
    assert _changelog_usage(kafka_bootstrap, topic_prefix + "other.") == (0, 0)  # another run's prefix
