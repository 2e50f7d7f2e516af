"""Create the v1 topics on a Kafka cluster (idempotent), with the registry's partitions and retention.

Used by the Faust worker, the fleet command and the tests so that every consumer subscribes to
topics that exist with the shared partition count (a consumer that subscribes before a topic
exists is not re-subscribed by aiokafka until its next metadata refresh, minutes later).
"""

from __future__ import annotations

from collections.abc import Iterable

from entroloop.topics import TOPICS, Topic


def ensure_topics(
    bootstrap: str,
    prefix: str = "",
    partitions: int | None = None,
    topics: Iterable[Topic] = TOPICS,
    timeout: float = 30.0,
) -> list[str]:
    """Create every missing topic ``prefix + name``; return the names that were created."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = set(admin.list_topics(timeout=timeout).topics)
    wanted = [
        NewTopic(
            prefix + t.name,
            num_partitions=partitions or t.partitions,
            replication_factor=-1,  # the broker's default.replication.factor
            config={"retention.ms": str(t.retention_ms)},
        )
        for t in topics
        if prefix + t.name not in existing
    ]
    if not wanted:
        return []
    created: list[str] = []
    for name, future in admin.create_topics(wanted, request_timeout=timeout).items():
        try:
            future.result(timeout=timeout)
            created.append(name)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # a concurrent creator won
                raise
    return created


__all__ = ["ensure_topics"]
