"""Create the v1 topics on a Kafka cluster (idempotent), with the registry's partitions and retention.

Used by the Faust worker, the fleet command and the tests so that every consumer subscribes to
topics that exist with the shared partition count (a consumer that subscribes before a topic
exists is not re-subscribed by aiokafka until its next metadata refresh, minutes later).

A created topic is returned only once the broker serves every one of its partitions. CreateTopics
answers when the controller has committed the topic, but the broker creates the partitions' logs
after that (in CI, up to 0.8 s later for 72 partitions on a busy machine), and an idempotent
producer that wrote in that window lost records with every delivery reported as a success (one
feedback record in a hundred in `demo --broker` and the sink tests). The likely mechanism: its
first batch to a partition fails (NOT_LEADER_OR_FOLLOWER), a later batch lands first (the broker
accepts any sequence from a producer it has no state for) and the retried first batch is then
never written (the same race on a leader election: confluent-kafka-go #921). ListOffsets fails in
that window exactly as Produce does, so the wait asks for every partition's end offset.
"""

from __future__ import annotations

import time
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
    """Create each topic of ``wanted`` (name -> partitions, topic config) that does not exist yet,
    and wait until the broker serves every partition of each (see the module docstring)."""
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
    wait_until_served(admin, {t.topic: t.num_partitions for t in new}, timeout)
    return created


def wait_until_served(admin: object, partitions: dict[str, int], timeout: float = 30.0) -> None:
    """Return once every partition of ``partitions`` (topic -> count) answers ListOffsets; raise
    ``TimeoutError`` naming those that do not within ``timeout`` seconds."""
    from confluent_kafka import TopicPartition
    from confluent_kafka.admin import OffsetSpec

    pending = {TopicPartition(topic, p) for topic, n in partitions.items() for p in range(n)}
    deadline = time.monotonic() + timeout
    while True:
        left = deadline - time.monotonic()
        admin.list_topics(timeout=max(1.0, left))  # type: ignore[attr-defined] # fresh leaders for the new topics
        futures = admin.list_offsets({tp: OffsetSpec.latest() for tp in pending},  # type: ignore[attr-defined]
                                     request_timeout=max(1.0, min(5.0, left)))
        for tp, future in futures.items():
            try:
                future.result()
            except Exception:  # noqa: BLE001 - not served yet (NOT_LEADER_OR_FOLLOWER, ...): ask again
                continue
            pending.discard(tp)
        if not pending:
            return
        if time.monotonic() >= deadline:
            names = sorted({f"{tp.topic}[{tp.partition}]" for tp in pending})
            raise TimeoutError(f"the broker does not serve {len(names)} partition(s) of the topics just created "
                               f"within {timeout:.0f} s: {', '.join(names[:6])}{' ...' if len(names) > 6 else ''}")
        time.sleep(0.1)


__all__ = ["ensure_topics", "create_missing_topics", "wait_until_served"]
