"""The ClickHouse sink: idempotent, columnar inserts of decoded records, one table per topic.

Idempotency has two layers. Each insert carries ``insert_deduplication_token`` =
``topic/partition/first-last`` offsets, so a batch redelivered after a crash between insert and
offset commit is dropped by ClickHouse (tables set ``non_replicated_deduplication_window``).
An event that arrives again at another offset (a publisher's spool replay after an ambiguous
delivery timeout) is dropped by ``sinks.recent_ids.RecentEventIds`` before the insert. Behind
both, every table is a ReplacingMergeTree keyed on ``event_id``, so a copy that slips past them
(after a sink restart) still ends as one row on merge (exact counts use ``FINAL``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from entroloop.contract.records import Event
from entroloop.contract.topics import TOPIC_BY_NAME
from entroloop.infra.clickhouse.schema import migrate
from sinks.clickhouse.arrow_rows import Column, build_table
from sinks.recent_ids import RecentEventIds


def batch_token(topic: str, ranges: Sequence[tuple[int, int, int]]) -> str:
    """Insert deduplication token of the ``(partition, first, last)`` offset ranges of ``topic``."""
    if len(ranges) == 1:
        partition, first, last = ranges[0]
        return f"{topic}/{partition}/{first}-{last}"
    return f"{topic}/" + ",".join(f"{p}:{f}-{l}" for p, f, l in ranges)


def insert_settings(token: str) -> dict[str, object]:
    """Settings of one idempotent insert: its deduplication token, applied to the rollup views too.

    The per-minute rollup tables (migration 0002) are filled by materialized views; with
    ``deduplicate_blocks_in_dependent_materialized_views`` a redelivered batch is dropped from the
    rollups as well as from the raw table (servers that already do this by default ignore it).

    ``optimize_on_insert=0``: a ReplacingMergeTree otherwise runs its replacing merge over every
    inserted block (a full copy of the block) to collapse rows with equal keys inside it. Events in
    one batch have distinct ``event_id``s, so that pass finds nothing and cost up to 40% of a
    spans insert; a duplicate that does arrive still collapses on merge, and exact queries use
    ``FINAL`` as before. The rollup views read the inserted block either way.
    """
    return {
        "insert_deduplication_token": token,
        "deduplicate_blocks_in_dependent_materialized_views": 1,
        "optimize_on_insert": 0,
    }


class ClickHouseSink:
    def __init__(self, client: Any, database: str = "entroloop", apply_migrations: bool = True) -> None:
        self.client = client
        self.database = database
        if apply_migrations:
            migrate(client, database)
        self._columns: dict[str, list[Column]] = {}
        self.rows_written = 0
        self.inserts = 0
        self.recent = RecentEventIds()  # event ids are unique across tables: one memory serves all
        # where a sink's time goes (bench, metrics): wall-clock and CPU seconds per stage
        self.stage_seconds = {"arrow": 0.0, "insert": 0.0}
        self.stage_cpu_seconds = {"arrow": 0.0, "insert": 0.0}

    def columns(self, table: str) -> list[Column]:
        """Ordinary columns of ``table`` (those an insert must supply), cached."""
        if table not in self._columns:
            rows = self.client.query(f"DESCRIBE TABLE {self.database}.{table}").result_rows
            self._columns[table] = [Column(r[0], r[1]) for r in rows if r[2] == ""]
        return self._columns[table]

    def insert(self, topic: str, ranges: Sequence[tuple[int, int, int]], records: Sequence[Event],
               token_prefix: str = "") -> int:
        """One idempotent insert of ``records`` read from ``topic`` at ``(partition, first, last)`` ``ranges``.

        ``token_prefix`` (the deployment's topic prefix) keeps two tenants sharing a database from
        producing equal tokens. Time spent building Arrow and inserting is added to ``stage_seconds``
        (wall clock) and ``stage_cpu_seconds``.
        """
        records = self.recent.unseen(records)
        if not records:
            return 0
        table = TOPIC_BY_NAME[topic].table
        started, started_cpu = time.perf_counter(), time.thread_time()
        arrow = build_table(table, self.columns(table), records)
        built, built_cpu, insert_cpu = time.perf_counter(), time.thread_time(), time.process_time()
        token = batch_token(token_prefix + topic, ranges)
        self.client.insert_arrow(f"{self.database}.{table}", arrow, settings=insert_settings(token))
        self.stage_seconds["arrow"] += built - started
        self.stage_seconds["insert"] += time.perf_counter() - built
        self.stage_cpu_seconds["arrow"] += built_cpu - started_cpu  # this thread: the build is Python
        self.stage_cpu_seconds["insert"] += time.process_time() - insert_cpu  # chDB's threads work too
        self.recent.remember(records)
        self.inserts += 1
        self.rows_written += len(records)
        return len(records)

    def write(self, topic: str, partition: int, first_offset: int, last_offset: int, records: Sequence[Event]) -> int:
        """Insert one batch read from ``topic``/``partition`` offsets ``first_offset..last_offset``."""
        return self.insert(topic, [(partition, first_offset, last_offset)], records)

    def write_slices(self, topic: str, slices: Sequence[Any]) -> int:
        """One insert for several partitions' ranges of ``topic`` (``sinks.batching.Slice`` items).

        The token names every range, so the same cut redelivered is dropped as a whole.
        """
        slices = [s for s in slices if s.records]
        records = [r for s in slices for r in s.records]
        return self.insert(topic, [(s.partition, s.first, s.last) for s in slices], records)

    def count(self, table: str) -> int:
        """Exact number of distinct events stored in ``table``."""
        return int(self.client.query(f"SELECT count() FROM {self.database}.{table} FINAL").result_rows[0][0])
