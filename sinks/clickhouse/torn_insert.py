"""Repair an insert that a crash of the ClickHouse process itself cut in two.

A non-replicated MergeTree commits an insert in two steps: it appends the block's deduplication
token to the table's deduplication log, then renames the written part into place. A materialized
view's target does the same after the source table, with a token of its own. When the process
running ClickHouse dies between the two steps (embedded chDB: the sink's process *is* the
database), the log remembers a block that no part holds, and the replay of that batch under the
same token is dropped as a duplicate. Two such windows exist (``strace`` of chDB 4.4 / ClickHouse
26.9: source log, source rename, then each view's log and rename):

* **raw torn** — the raw table's token is logged, its part lost, the rollup views not yet run.
  The replay is dropped by the raw table and *counted* by the views (their logs lack the token),
  so the raw table misses the batch for good. ``restore_missing_rows`` finds the batch's events
  that the table lacks and attaches them from a staging copy (``ATTACH PARTITION ... FROM``):
  that bypasses both the deduplication log and the views, which already counted them.
* **rollup torn** — the raw part committed, a view's token logged and its part lost. The replay is
  dropped by both, so that rollup misses the batch. ``restore_missing_rollups`` compares, over the
  batch's minutes, the rollup with the view's own query run on the raw table; when the rollup lacks
  exactly the batch's share it inserts that share (the view's query over the batch's rows only).

Only one insert is in flight when a single-writer process dies, so after a crash only the batches
journaled but not committed can be torn (``restore_missing_rows``) and only the newest raw insert
can have lost a view's part (``newest_insert``, ``restore_missing_rollups``). A ClickHouse server
survives its clients' crashes whole; this matters when the server itself dies.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from entroloop.contract.records import Event

log = logging.getLogger(__name__)

_STAGING_SUFFIX = "__torn_insert_staging"
_COUNTER = "SimpleAggregateFunction(sum, UInt64)"  # how migration 0002's rollups keep their counts


def _quote(text: str) -> str:
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


@dataclass(frozen=True)
class RollupView:
    name: str
    source: str  # raw table
    target: str  # rollup table
    query: str  # the view's SELECT, reading ``{database}.{source}``
    sums: tuple[str, ...]  # the target's additive counters (``_COUNTER`` columns outside the sorting key)


def newest_insert(client: Any, database: str, tables: Sequence[str]) -> tuple[str, str] | None:
    """``(table, insert_token)`` of the newest rows the event ``tables`` hold (by ``inserted_at``)."""
    union = " UNION ALL ".join(
        f"(SELECT '{t}' AS tbl, insert_token, inserted_at FROM {database}.{t} ORDER BY inserted_at DESC LIMIT 1)"
        for t in tables)
    rows = client.query(f"SELECT tbl, insert_token FROM ({union}) ORDER BY inserted_at DESC LIMIT 1").result_rows
    return (rows[0][0], rows[0][1]) if rows and rows[0][1] else None


def rollup_views(client: Any, database: str, source: str) -> list[RollupView]:
    """The materialized views that read ``source``, each with its target and the target's counters."""
    views = []
    rows = client.query(
        "SELECT name, as_select, create_table_query FROM system.tables "
        f"WHERE database = '{database}' AND engine = 'MaterializedView'").result_rows
    for name, query, create in rows:
        if f" FROM {database}.{source} " not in f"{query} ":
            continue
        target = create.split(" TO ", 1)[1].split()[0].split(".", 1)[1].strip("`")
        key = client.query(f"SELECT sorting_key FROM system.tables WHERE database = '{database}' "
                           f"AND name = '{target}'").result_rows[0][0]
        keys = {k.strip() for k in key.split(",")}
        columns = client.query(f"DESCRIBE TABLE {database}.{target}").result_rows
        sums = tuple(c[0] for c in columns if c[1] == _COUNTER and c[0] not in keys)
        views.append(RollupView(name, source, target, query, sums))
    return views


def _over(view: RollupView, database: str, where: str) -> str:
    """The view's query over the raw rows matching ``where`` (not the whole table)."""
    source = f" FROM {database}.{view.source} "
    return f"{view.query} ".replace(source, f" FROM (SELECT * FROM {source[6:-1]} WHERE {where}) ", 1).strip()


def restore_missing_rows(sink: Any, table: str, records: Sequence[Event], token: str) -> int:
    """Attach the events of ``records`` that ``table`` lacks, without feeding its views; how many.

    ``records`` were just inserted (again) under ``token``: what the table still lacks was dropped
    by a deduplication log that outlived its part. Their minute range bounds the read.
    """
    if not records:
        return 0
    db, client = sink.database, sink.client
    lo = min(r.emitted_at for r in records)
    hi = max(r.emitted_at for r in records)
    ids = ",".join(_quote(str(r.event_id)) for r in records)
    stored = {str(row[0]) for row in client.query(
        f"SELECT DISTINCT toString(event_id) FROM {db}.{table} "
        f"WHERE emitted_at BETWEEN fromUnixTimestamp64Milli({int(lo * 1000) - 1}) "
        f"AND fromUnixTimestamp64Milli({int(hi * 1000) + 1}) AND event_id IN ({ids})").result_rows}
    missing = [r for r in records if str(r.event_id) not in stored]
    if not missing:
        return 0
    staging = f"{db}.{table}{_STAGING_SUFFIX}"
    client.command(f"DROP TABLE IF EXISTS {staging} SYNC")
    client.command(f"CREATE TABLE {staging} AS {db}.{table}")
    try:
        client.insert_arrow(staging, sink.arrow(table, missing), settings={"insert_deduplication_token": token})
        partitions = client.query(
            f"SELECT DISTINCT partition_id FROM system.parts WHERE database = '{db}' "
            f"AND table = '{table}{_STAGING_SUFFIX}' AND active").result_rows
        for (partition_id,) in partitions:
            client.command(f"ALTER TABLE {db}.{table} ATTACH PARTITION ID '{partition_id}' FROM {staging}")
    finally:
        client.command(f"DROP TABLE IF EXISTS {staging} SYNC")
    log.warning("restored %d rows of %s (insert %s) that a crash inside ClickHouse's commit had lost",
                len(missing), table, token)
    return len(missing)


def restore_missing_rollups(client: Any, database: str, table: str, token: str) -> int:
    """Add the share of the rows inserted under ``token`` to each rollup of ``table`` that lacks
    exactly that share; the number of rollups repaired."""
    batch = f"insert_token = {_quote(token)}"
    bounds = client.query(f"SELECT min(toStartOfMinute(emitted_at)), max(toStartOfMinute(emitted_at)), count() "
                          f"FROM {database}.{table} WHERE {batch}").result_rows[0]
    if not bounds[2]:
        return 0
    lo, hi = (f"toDateTime('{b:%Y-%m-%d %H:%M:%S}', 'UTC')" for b in bounds[:2])
    minutes = f"toStartOfMinute(emitted_at) BETWEEN {lo} AND {hi}"
    repaired = 0
    for view in rollup_views(client, database, table):
        if not view.sums:
            continue
        sums = ", ".join(f"toInt64(sum({c}))" for c in view.sums)
        share = client.query(f"SELECT {sums} FROM ({_over(view, database, batch)})").result_rows[0]
        expected = client.query(f"SELECT {sums} FROM ({_over(view, database, minutes)})").result_rows[0]
        actual = client.query(f"SELECT {sums} FROM {database}.{view.target} "
                              f"WHERE minute BETWEEN {lo} AND {hi}").result_rows[0]
        if any(share) and all(a + s == e for a, s, e in zip(actual, share, expected, strict=True)):
            query = _over(view, database, batch)
            columns = ", ".join(r[0] for r in client.query(f"DESCRIBE ({query})").result_rows)
            client.command(f"INSERT INTO {database}.{view.target} ({columns}) "
                           f"SETTINGS insert_deduplication_token = {_quote(token + '/rollup-repair')} {query}")
            log.warning("restored the share of insert %s in rollup %s, lost by a crash inside ClickHouse's commit",
                        token, view.target)
            repaired += 1
    return repaired
