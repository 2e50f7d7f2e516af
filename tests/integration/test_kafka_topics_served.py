"""Topics come back from `ensure_topics` only once the broker serves every partition.

CreateTopics answers when the controller has committed the topic; this broker then takes ~20 ms a
partition to create the logs (141 of 144 partitions answered NOT_LEADER_OR_FOLLOWER right after a
bare CreateTopics here). An idempotent producer writing in that window lost one record in a hundred
with every delivery reported as a success (`demo --broker`, `test_sinks_store_every_event_once`).
"""

from __future__ import annotations

import pytest
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from entroloop.infra.kafka_topics import create_missing_topics

pytestmark = pytest.mark.kafka

TOPICS, PARTITIONS = 6, 12


def test_every_partition_of_a_created_topic_is_served_when_creation_returns(kafka_bootstrap: str,
                                                                              topic_prefix: str) -> None:
    wanted = {f"{topic_prefix}served-{i}": (PARTITIONS, {}) for i in range(TOPICS)}
    assert sorted(create_missing_topics(kafka_bootstrap, wanted)) == sorted(wanted)
    # One ListOffsets round, no retry: a partition the broker does not lead yet fails it.
    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    admin.list_topics(timeout=10)
    futures = admin.list_offsets({TopicPartition(t, p): OffsetSpec.latest() for t in wanted for p in range(PARTITIONS)},
                                 request_timeout=5)
    failed = {}
    for tp, future in futures.items():
        try:
            assert future.result().offset == 0
        except Exception as exc:  # noqa: BLE001 - collected and reported below
            failed[f"{tp.topic}[{tp.partition}]"] = str(exc)
    assert not failed, f"{len(failed)} of {TOPICS * PARTITIONS} partitions not served: {sorted(failed.items())[:3]}"
    # A second call finds them all and creates (and waits for) nothing.
    assert create_missing_topics(kafka_bootstrap, wanted) == []
