"""Create the v1 topics on a Kafka cluster (idempotent), with the registry's partitions and retention.

Used by the Faust worker, the fleet command and the tests so that every consumer subscribes to
topics that exist with the shared partition count (a consumer that subscribes before a topic
exists is not re-subscribed by aiokafka until its next metadata refresh, minutes later).
"""

from __future__ import annotations

from collections.abc import Iterable

from entroloop.contract.topics import TOPICS, Topic


def ensure_topics(
    bootstrap: str,
    prefix: str = "",
    partitions: int | None = None,
    topics: Iterable[Topic] = TOPICS,
    timeout: float = 30.0,
) -> list[str]:
    """Create every missing topic ``prefix + name``; return the names that were created."""
    return create_missing_topics(
        bootstrap,
        {prefix + t.name: (partitions or t.partitions, {"retention.ms": str(t.retention_ms)}) for t in topics},
        timeout,
    )


def create_missing_topics(bootstrap: str, wanted: dict[str, tuple[int, dict[str, str]]], timeout: float = 30.0) -> list[str]:
    """Create each topic of ``wanted`` (name -> partitions, topic config) that does not exist yet."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = set(admin.list_topics(timeout=timeout).topics)
    new = [
        NewTopic(name, num_partitions=n, replication_factor=-1, config=config)  # -1: the broker's default
        for name, (n, config) in wanted.items()
        if name not in existing
    ]
    if not new:
        return []
    created: list[str] = []
    for name, future in admin.create_topics(new, request_timeout=timeout).items():
        try:
            future.result(timeout=timeout)
            created.append(name)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # a concurrent creator won
                raise
    return created


__all__ = ["ensure_topics", "create_missing_topics"]
