"""A worker whose output the broker refuses commits nothing past it and stops; a restarted one
processes those inputs again (entroloop.streams.faust_delivery), against the real broker.

The alerts topic is created with ``max.message.bytes`` below an alert's size, so every output
batch is refused for good (MESSAGE_TOO_LARGE, as a too-small topic limit or an ACL would do in a
deployment). Before the guard, Faust committed the inputs anyway and the alerts were lost with a
log line: the second half of this test then finds none.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from entroloop.contract import codec
from entroloop.contract.records import Alert, Feedback
from entroloop.infra.kafka_topics import create_missing_topics, ensure_topics
from tests.integration.test_streams_worker_kafka import (
    TOPICS,
    TopicReader,
    Worker,
    feedback,
    produce,
    seen_alerts,
)

pytestmark = pytest.mark.kafka


def _set_topic_config(bootstrap: str, topic: str, name: str, value: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    entry = ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
    for future in admin.incremental_alter_configs([ConfigResource(ResourceType.TOPIC, topic,
                                                                  incremental_configs=[entry])]).values():
        future.result(timeout=30)


def test_a_refused_output_batch_stops_the_commits_and_the_restarted_worker_delivers_it(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    alerts_topic = topic_prefix + Alert.topic
    create_missing_topics(kafka_bootstrap, {alerts_topic: (1, {"max.message.bytes": "100"})})
    ensure_topics(kafka_bootstrap, topic_prefix, partitions=1, topics=TOPICS)
    records = feedback(6, slow_first=False)
    produce(kafka_bootstrap, topic_prefix + Feedback.topic, [(r.request_id.encode(), codec.encode(r)) for r in records])

    first = Worker(tmp_path, kafka_bootstrap, topic_prefix, "none", "0", "1")
    try:
        code = first.wait(timeout=120)
    finally:
        first.kill()
    log = first.log_text()
    assert code != 0, f"the worker went on after its outputs were refused:\n{log[-4000:]}"
    assert "no offset is committed past it" in log, log[-4000:]

    _set_topic_config(kafka_bootstrap, alerts_topic, "max.message.bytes", "1048588")
    alerts = TopicReader(kafka_bootstrap, alerts_topic)
    second = Worker(tmp_path, kafka_bootstrap, topic_prefix, "none", "0", "1")
    try:
        wanted = {r.event_id for r in records}
        delivered = alerts.read_until(lambda got: seen_alerts(got) >= wanted, timeout=90)
        assert delivered, (f"alerts for {len(wanted - seen_alerts(alerts.records))} of {len(wanted)} inputs never "
                           f"came: their offsets were committed while the alerts were refused\n{second.log_tail()}")
        assert second.poll() is None, second.log_tail()
    finally:
        second.kill(timeout=60)
        alerts.close()
