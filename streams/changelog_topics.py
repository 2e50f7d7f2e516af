"""Create the compacted changelog topics of the Faust tables.

The Faust app runs with ``topic_allow_declare=False`` (topics are ours to create, with our
retention), so Faust does not declare its tables' changelogs either: the worker creates them here
before it starts. Compaction keeps the last value of every key and drops a key after its
tombstone, so recovery reads the live state, not the whole history.
"""

from __future__ import annotations

from collections.abc import Iterable


def ensure_changelog_topics(bootstrap: str, names: Iterable[str], partitions: int, timeout: float = 30.0) -> list[str]:
    """Create every missing changelog topic (compacted, ``partitions`` partitions); return the created."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    existing = set(admin.list_topics(timeout=timeout).topics)
    wanted = [
        NewTopic(name, num_partitions=partitions, replication_factor=-1, config={"cleanup.policy": "compact"})
        for name in names
        if name not in existing
    ]
    created: list[str] = []
    if not wanted:
        return created
    for name, future in admin.create_topics(wanted, request_timeout=timeout).items():
        try:
            future.result(timeout=timeout)
            created.append(name)
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:  # a concurrent creator won
                raise
    return created


__all__ = ["ensure_changelog_topics"]
