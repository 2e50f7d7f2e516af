"""When a run-until-idle consumer loop may stop: every partition it holds is read to its end.

Consumers built with ``enable.partition.eof`` (``manual_commit_consumer_config``) get one
``_PARTITION_EOF`` event each time a partition reaches its log end; a record polled after it means
that partition has more. A rebalance takes partitions away, and their end marks with them, so a
loop that lost every partition is not "drained" (it holds nothing and waits to be given some).
Shared by the record loops (``entroloop.infra.kafka_record_loop``) and the trainer's consumer.
"""

from __future__ import annotations

from typing import Any


class DrainWatch:
    """The assigned partitions and which of them are at their end; pass ``on_assign`` and
    ``on_revoke`` (also as ``on_lost``) to ``Consumer.subscribe``."""

    def __init__(self) -> None:
        self.assigned: set[int] = set()
        self.at_end: set[int] = set()

    def on_assign(self, _consumer: Any, partitions: list[Any]) -> None:
        self.assigned |= {p.partition for p in partitions}

    def on_revoke(self, _consumer: Any, partitions: list[Any]) -> None:
        gone = {p.partition for p in partitions}
        self.assigned -= gone
        self.at_end -= gone

    def reached_end(self, partition: int) -> None:
        """A ``_PARTITION_EOF`` event for ``partition``."""
        self.at_end.add(partition)

    def got_record(self, partition: int) -> None:
        """A record from ``partition``: it was not at its end after all."""
        self.at_end.discard(partition)

    @property
    def drained(self) -> bool:
        return bool(self.assigned) and self.assigned <= self.at_end


__all__ = ["DrainWatch"]
