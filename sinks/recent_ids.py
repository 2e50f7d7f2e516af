"""The event ids a sink stored lately, so a copy of an event that arrives again is not stored twice.

Offset-range tokens (ClickHouse's ``insert_deduplication_token``, the audit object keys) make a
*redelivered range* idempotent. They cannot see the same event at a *second offset*: a serving
node's publisher that replays its disk spool after a delivery timeout re-sends records the broker
may already hold (a timed-out request is ambiguous), and those copies sit at new offsets. The
sink drops any record whose ``event_id`` it stored within its last ``capacity`` ids, or that
repeats inside one batch. Ids are remembered only after the durable write returned, so a failed
write that is retried carries the same records (and so the same bytes and token) again.

The memory is per process. A starting ClickHouse sink reads back what its tables stored in the
last minutes, with each row's insert token (``ClickHouseSink.stored_before_start``, let go once the
sink has stored ``capacity`` newer ids), and the audit writer reads back the ids of each chain's
newest sealed batches when it opens the chain (``entroloop.sinks.audit.stored_ids``), so a copy
arriving right after a restart is dropped too. A copy more than ``capacity`` ids
later (or past the read-back window) still lands as a second raw row, which ClickHouse's
ReplacingMergeTree collapses on merge (exact queries use ``FINAL``). 200,000 ids are about 30 MB and
cover a spool replay of minutes at fleet rates.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import islice
from typing import TypeVar

from entroloop.contract.records import Event

E = TypeVar("E", bound=Event)

DEFAULT_CAPACITY = 200_000


class RecentEventIds:
    """A bounded, insertion-ordered set of the event ids stored last."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, not {capacity}")
        self.capacity = capacity
        self._ids: dict[str, None] = {}  # insertion order = age; the oldest are forgotten first
        self.dropped = 0  # copies not stored, for stats and metrics

    def __len__(self) -> int:
        return len(self._ids)

    def unseen(self, records: Sequence[E]) -> list[E]:
        """``records`` less those stored lately and less repeats within ``records`` (first kept)."""
        seen, fresh = self._ids, []
        in_batch: set[str] = set()
        for record in records:
            event_id = record.event_id
            if event_id in seen or event_id in in_batch:
                self.dropped += 1
                continue
            in_batch.add(event_id)
            fresh.append(record)
        return fresh

    def remember(self, records: Sequence[Event]) -> None:
        """Note ``records`` as stored (call after the durable write returned)."""
        self.remember_ids(record.event_id for record in records)

    def remember_ids(self, event_ids: Iterable[str]) -> None:
        """Note ids as stored, oldest first (a restarted sink's read-back of what it stored)."""
        ids = self._ids
        for event_id in event_ids:
            ids[event_id] = None
        excess = len(ids) - self.capacity
        if excess > 0:
            for event_id in list(islice(ids, excess)):
                del ids[event_id]


__all__ = ["DEFAULT_CAPACITY", "RecentEventIds"]
