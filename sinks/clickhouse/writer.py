"""The ClickHouse sink: idempotent, columnar inserts of decoded records, one table per topic.

Idempotency has two layers. Each insert carries ``insert_deduplication_token`` =
``topic/partition/first-last`` offsets, so a batch redelivered after a crash between insert and
offset commit is dropped by ClickHouse (tables set ``non_replicated_deduplication_window``).
An event that arrives again at another offset (a publisher's spool replay after an ambiguous
delivery timeout) is dropped by ``entroloop.sinks.recent_ids.RecentEventIds`` before the insert.
That memory dies with the process, so a starting sink reads back the ids its tables stored in the
last ``SEED_WINDOW_S`` seconds with the token each was inserted under (migration 0010's
``insert_token``): one stored by another batch is a copy and is dropped too; one stored by this
same batch (a redelivery after a crash) is not, because ClickHouse's token check must decide it (an
insert torn between the raw table and its rollup views is then completed, not skipped). That check
itself can be wrong after a crash of the database's own process (chDB): ``repair_replay`` completes
a replayed batch whose token outlived its part (``entroloop.sinks.clickhouse.torn_insert``). Behind all
of them, every table is a ReplacingMergeTree keyed on ``event_id``, so a copy that slips past them
(outside the window) still ends as one row on merge (exact counts use ``FINAL``; the rollups count
it twice).

A batch that ClickHouse refuses because of one record is bisected (``entroloop.sinks.clickhouse.poison``):
the good records are inserted under tokens derived from the batch's, and each record refused on
its own is handed to the caller's ``on_poison`` (which dead-letters it) instead of stopping the sink.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from entroloop.sinks.clickhouse.arrow_rows import Column, build_table
from entroloop.sinks.clickhouse.poison import (
    PoisonRecordsError,
    insert_isolating_poison,
)
from entroloop.sinks.clickhouse.torn_insert import (
    newest_insert,
    restore_missing_rollups,
    restore_missing_rows,
)
from entroloop.sinks.recent_ids import RecentEventIds

from entroloop.contract.records import Event
from entroloop.contract.topics import TOPIC_BY_NAME
from entroloop.infra.clickhouse.schema import applied_migrations, migrate
from entroloop.infra.quarantine import Quarantine, strip_payloads

SEED_WINDOW_S = 600.0
"""A starting sink remembers the events its tables stored in this many seconds before it (the newest
``RecentEventIds`` capacity of them): a spool replay comes within minutes of the delivery it repeats."""
EVENT_TABLES = tuple(sorted({topic.table for topic in TOPIC_BY_NAME.values()}))
_INSERT_TOKEN_MIGRATION = 10  # the event tables' insert_token column and inserted_at index

# on_poison(index, record, reason): ``records[index]`` of an insert was refused on its own
OnPoison = Callable[[int, Event, str], None]


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
    # callers may pass ``on_poison`` to write/insert (the Kafka sink consumer looks for this)
    isolates_poison = True

    def __init__(self, client: Any, database: str = "entroloop", apply_migrations: bool = True,
                 quarantine: Quarantine | None = None, seed_window_s: float = SEED_WINDOW_S,
                 embedded: bool = False) -> None:
        self.client = client
        self.database = database
        # dead letters' raw bytes go here, never into dead_letters (analysts can query that table)
        self.quarantine = quarantine
        if apply_migrations:
            migrate(client, database)
        self._columns: dict[str, list[Column]] = {}
        self.rows_written = 0
        self.inserts = 0
        self.poison_records = 0  # records refused on their own and handed to on_poison
        self.recent = RecentEventIds()  # event ids are unique across tables: one memory serves all
        # event id -> insert token, of what the tables stored lately before this process started
        self.stored_before_start: dict[str, str] = {}
        # embedded (chDB): this process is the database, so a crash of it can tear the newest insert
        # between a raw table and a rollup view (``repair_replay``); a server finishes what it began
        self.newest_insert_at_start: tuple[str, str] | None = None
        self.torn_rows_restored = 0  # rows and rollup shares ``repair_replay`` put back
        self.torn_rollups_restored = 0
        if _INSERT_TOKEN_MIGRATION in applied_migrations(client, database):
            if seed_window_s > 0:
                self.stored_before_start = self.stored_since(seed_window_s, self.recent.capacity)
            if embedded:
                self.newest_insert_at_start = newest_insert(client, database, EVENT_TABLES)
        # where a sink's time goes (bench, metrics): wall-clock and CPU seconds per stage
        self.stage_seconds = {"arrow": 0.0, "insert": 0.0}
        self.stage_cpu_seconds = {"arrow": 0.0, "insert": 0.0}

    def stored_since(self, seconds: float, limit: int) -> dict[str, str]:
        """Event id -> insert token of the rows the event tables received in the last ``seconds``
        (``inserted_at``), the newest ``limit``. One query; migration 0010's index on inserted_at
        keeps it to the granules written lately."""
        union = " UNION ALL ".join(
            f"SELECT event_id, insert_token, inserted_at FROM {self.database}.{table} "
            f"WHERE inserted_at >= now64(3) - toIntervalMillisecond({int(seconds * 1000)})"
            for table in EVENT_TABLES)
        rows = self.client.query(f"SELECT toString(event_id), insert_token FROM ({union}) "
                                 f"ORDER BY inserted_at DESC LIMIT {int(limit)}").result_rows
        return {event_id: token for event_id, token in rows}

    def _not_stored_by_another_batch(self, records: list[Event], token: str) -> list[Event]:
        """``records`` less those a batch other than ``token``'s stored before this process started
        (copies); records that ``token`` itself stored (or a piece of it: ``token/0/1``) are kept,
        for ClickHouse's token check. An unknown token ('': stored before migration 0010) is no proof."""
        known, piece = self.stored_before_start, token + "/"
        return [r for r in records
                if not (stored_by := known.get(r.event_id)) or stored_by == token or stored_by.startswith(piece)]

    def columns(self, table: str) -> list[Column]:
        """Ordinary columns of ``table`` (those an insert must supply), cached."""
        if table not in self._columns:
            rows = self.client.query(f"DESCRIBE TABLE {self.database}.{table}").result_rows
            self._columns[table] = [Column(r[0], r[1]) for r in rows if r[2] == ""]
        return self._columns[table]

    def insert(self, topic: str, ranges: Sequence[tuple[int, int, int]], records: Sequence[Event],
               token_prefix: str = "", on_poison: OnPoison | None = None) -> int:
        """One idempotent insert of ``records`` read from ``topic`` at ``(partition, first, last)`` ``ranges``.

        ``token_prefix`` (the deployment's topic prefix) keeps two tenants sharing a database from
        producing equal tokens. Time spent building Arrow and inserting is added to ``stage_seconds``
        (wall clock) and ``stage_cpu_seconds``.

        If ClickHouse refuses the batch because of some of its records, the batch is bisected: the
        rest is inserted and ``on_poison(index, record, reason)`` is called for each refused record
        (``index`` into ``records``; ``reason`` is ClickHouse's error) after the rest is stored.
        Without ``on_poison`` the refusal is raised as ``PoisonRecordsError`` after the rest is
        stored. Errors that are not about records (ClickHouse down, disk full) are raised unchanged.
        """
        token = batch_token(token_prefix + topic, ranges)
        fresh = self.recent.unseen(records)
        if self.stored_before_start and fresh:
            kept = self._not_stored_by_another_batch(fresh, token)
            self.recent.dropped += len(fresh) - len(kept)
            fresh = kept
        if not fresh:
            return 0
        table = TOPIC_BY_NAME[topic].table
        fresh_ids = {id(r) for r in fresh}

        def insert_fresh(part: Sequence[Event], part_token: str) -> None:
            rows = [r for r in part if id(r) in fresh_ids]
            if rows:
                self._insert_part(table, rows, part_token)

        # The cut is of the whole batch, the recent-id filter applied inside each piece: a redelivery
        # (same offsets, same records) is cut at the same records whatever that memory holds (a
        # restart empties it), so a piece's token always names the same rows.
        poison = insert_isolating_poison(records, token, insert_fresh)
        if poison:
            self.poison_records += len(poison)
            if on_poison is None:
                raise PoisonRecordsError(table, [(p.index, p.item, p.reason) for p in poison])
            for p in poison:
                on_poison(p.index, p.item, p.reason)
        return len(fresh) - len(poison)

    def arrow(self, table: str, records: Sequence[Event]) -> Any:
        """The Arrow table an insert of ``records`` into ``table`` sends."""
        if table == "dead_letters":  # the row keeps reason, size and SHA-256; the bytes are quarantined first
            records = strip_payloads(list(records), self.quarantine)  # type: ignore[arg-type]
        return build_table(table, self.columns(table), records)

    def _insert_part(self, table: str, records: Sequence[Event], token: str) -> None:
        """Build and insert one piece of a batch; remember its ids once it is stored."""
        started, started_cpu = time.perf_counter(), time.thread_time()
        arrow = self.arrow(table, records)
        built, built_cpu, insert_cpu = time.perf_counter(), time.thread_time(), time.process_time()
        self.client.insert_arrow(f"{self.database}.{table}", arrow, settings=insert_settings(token))
        self.stage_seconds["arrow"] += built - started
        self.stage_seconds["insert"] += time.perf_counter() - built
        self.stage_cpu_seconds["arrow"] += built_cpu - started_cpu  # this thread: the build is Python
        self.stage_cpu_seconds["insert"] += time.process_time() - insert_cpu  # chDB's threads work too
        self.recent.remember(records)
        self.inserts += 1  # pieces of a bisected batch count one each: they are real inserts
        self.rows_written += len(records)
        if self.stored_before_start and self.rows_written >= self.recent.capacity:
            # the live memory holds as many ids, all newer: it guarantees what the read-back did
            self.stored_before_start = {}

    def repair_replay(self, topic: str, ranges: Sequence[tuple[int, int, int]], stored: Sequence[Event],
                      token_prefix: str = "") -> int:
        """Complete the replay of a batch a crashed process may have been inserting; rows restored.

        Call it right after the batch's insert, for a batch journaled but never committed, with the
        records it stored (not the ones refused as poison). ClickHouse may have logged the batch's
        token and lost its part (``entroloop.sinks.clickhouse.torn_insert``): the rows the raw table
        still lacks are attached without feeding the rollups again. Embedded, the rollups are also
        checked for the share of the newest insert before this process started.
        """
        token = batch_token(token_prefix + topic, ranges)
        table = TOPIC_BY_NAME[topic].table
        restored = restore_missing_rows(self, table, stored, token)
        self.torn_rows_restored += restored
        newest = self.newest_insert_at_start
        if newest and newest[0] == table and (newest[1] == token or newest[1].startswith(token + "/")):
            self.torn_rollups_restored += restore_missing_rollups(self.client, self.database, table, newest[1])
        return restored

    def write(self, topic: str, partition: int, first_offset: int, last_offset: int, records: Sequence[Event],
              on_poison: OnPoison | None = None) -> int:
        """Insert one batch read from ``topic``/``partition`` offsets ``first_offset..last_offset``."""
        return self.insert(topic, [(partition, first_offset, last_offset)], records, on_poison=on_poison)

    def write_slices(self, topic: str, slices: Sequence[Any], on_poison: OnPoison | None = None) -> int:
        """One insert for several partitions' ranges of ``topic`` (``entroloop.sinks.batching.Slice`` items).

        The token names every range, so the same cut redelivered is dropped as a whole.
        """
        slices = [s for s in slices if s.records]
        records = [r for s in slices for r in s.records]
        return self.insert(topic, [(s.partition, s.first, s.last) for s in slices], records, on_poison=on_poison)

    def count(self, table: str) -> int:
        """Exact number of distinct events stored in ``table``."""
        return int(self.client.query(f"SELECT count() FROM {self.database}.{table} FINAL").result_rows[0][0])
