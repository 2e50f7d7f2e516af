"""Create the compacted changelog topics of the Faust tables.

The Faust app runs with ``topic_allow_declare=False`` (topics are ours to create, with our
retention), so Faust does not declare its tables' changelogs either: the worker creates them here
before it starts. Compaction keeps the last value of every key and drops a key after its
tombstone, so recovery reads the live state, not the whole history.
"""

from __future__ import annotations

from collections.abc import Iterable

from entroloop.infra.kafka_topics import create_missing_topics


def ensure_changelog_topics(bootstrap: str, names: Iterable[str], partitions: int, timeout: float = 30.0) -> list[str]:
    """Create every missing changelog topic (compacted, ``partitions`` partitions); return the created."""
    return create_missing_topics(bootstrap, {name: (partitions, {"cleanup.policy": "compact"}) for name in names}, timeout)


__all__ = ["ensure_changelog_topics"]
