"""A copy of an event that arrives again at another offset (a publisher's spool replay after an
ambiguous delivery timeout) is stored once: one raw ClickHouse row, one audit row, a gap-free chain.
"""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from entroloop.sinks.audit.parquet_writer import AuditParquetWriter
from entroloop.sinks.audit.verify import verify_store
from entroloop.sinks.clickhouse.writer import ClickHouseSink
from entroloop.sinks.recent_ids import RecentEventIds

from entroloop.contract.records import Audit, Feedback
from entroloop.infra.worm.reader import manifest_files
from entroloop.infra.worm.worm_store import LocalWormStore
from tests.unit.sinks.sink_records import sample_records


def test_unseen_drops_remembered_ids_and_repeats_within_a_batch() -> None:
    records = sample_records(60, seed=3)[Feedback.topic]
    assert len(records) >= 6
    recent = RecentEventIds(capacity=100)
    assert recent.unseen(records + records[:2]) == records  # repeats inside one batch: first kept
    recent.remember(records[:3])
    assert recent.unseen(records) == records[3:]
    assert recent.dropped == 2 + 3


def test_only_the_newest_ids_are_remembered() -> None:
    records = sample_records(60, seed=4)[Feedback.topic]
    assert len(records) >= 6
    recent = RecentEventIds(capacity=3)
    recent.remember(records)
    assert len(recent) == 3
    assert recent.unseen(records) == records[:-3]  # the oldest were forgotten


def test_capacity_must_be_positive() -> None:
    with pytest.raises(ValueError, match="capacity"):
        RecentEventIds(capacity=0)


def test_clickhouse_stores_an_event_resent_at_another_offset_once(chdb_client, ch_database) -> None:
    feedback = sample_records(150, seed=5)[Feedback.topic]
    assert len(feedback) >= 20
    sink = ClickHouseSink(chdb_client, ch_database)
    assert sink.write(Feedback.topic, 0, 0, len(feedback) - 1, feedback) == len(feedback)
    # the spool replays five of them, which land after the originals, next to one new record
    fresh = sample_records(60, seed=6)[Feedback.topic][-1:]
    resent = feedback[10:15] + fresh
    assert sink.write(Feedback.topic, 0, len(feedback), len(feedback) + len(resent) - 1, resent) == 1
    rows = chdb_client.query(f"SELECT event_id, count() FROM {ch_database}.feedback GROUP BY event_id").result_rows
    assert len(rows) == len(feedback) + 1
    assert max(n for _, n in rows) == 1, "a raw row stored twice (no FINAL here)"
    assert sink.recent.dropped == 5


def test_audit_log_stores_an_audit_resent_at_another_offset_once(tmp_path: Path) -> None:
    audits = sample_records(30, seed=7)[Audit.topic]
    assert len(audits) == 30  # one audit per request
    store = LocalWormStore(tmp_path / "worm")
    writer = AuditParquetWriter(store)
    writer.write(Audit.topic, 0, 0, 19, audits[:20])
    writer.write(Audit.topic, 0, 20, 29, audits[3:5] + audits[20:28])  # two copies among new records
    writer.write(Audit.topic, 0, 30, 31, audits[:2])  # a batch of nothing but copies
    ids = [row["event_id"] for key in manifest_files(store, Audit.topic)
           for row in pq.read_table(pa.BufferReader(store.get(key))).to_pylist()]
    assert sorted(ids) == sorted(a.event_id for a in audits[:28])
    verdict = verify_store(store)
    assert verdict.ok, [str(p) for p in verdict.problems]
    assert writer.chain(Audit.topic, 0).last_offset == 31  # the chain covers every offset: no gap


def _rollup_feedback(client, database: str) -> int:
    return int(client.query(f"SELECT sum(feedback) FROM {database}.feedback_1m").result_rows[0][0])


def test_a_restarted_clickhouse_sink_still_drops_a_copy_of_what_another_batch_stored(chdb_client, ch_database) -> None:
    """SIGKILL after an insert: the memory of recent ids dies with the process. The next sink reads the
    ids stored lately back from the tables, with the token each was inserted under, so a spool replay
    of those events in another batch is not stored again: not as a raw row, and not counted twice by the
    per-minute rollups (which no merge fixes)."""
    feedback = sample_records(150, seed=8)[Feedback.topic]
    assert len(feedback) >= 20
    n = len(feedback)
    ClickHouseSink(chdb_client, ch_database).write(Feedback.topic, 0, 0, n - 1, feedback)
    assert _rollup_feedback(chdb_client, ch_database) == n

    restarted = ClickHouseSink(chdb_client, ch_database, apply_migrations=False)
    assert set(restarted.stored_before_start) == {f.event_id for f in feedback}
    new = sample_records(60, seed=9)[Feedback.topic][-1:]
    resent = feedback[:5] + new + feedback[-5:]
    assert restarted.write(Feedback.topic, 3, n, n + len(resent) - 1, resent) == 1
    assert restarted.write(Feedback.topic, 3, n + 20, n + 21, feedback[7:9]) == 0  # a batch of nothing but copies
    rows = chdb_client.query(f"SELECT count(), uniqExact(event_id) FROM {ch_database}.feedback").result_rows[0]
    assert rows == (n + 1, n + 1), "a raw row stored twice (no FINAL here)"
    assert _rollup_feedback(chdb_client, ch_database) == n + 1, "the rollup counted a copy"
    assert restarted.recent.dropped == 12

    # without the read-back (a restart past the window: what every restart did before) they are stored again
    unseeded = ClickHouseSink(chdb_client, ch_database, apply_migrations=False, seed_window_s=0)
    assert unseeded.write(Feedback.topic, 3, n + 30, n + 32, feedback[10:13]) == 3
    assert _rollup_feedback(chdb_client, ch_database) == n + 4


def test_the_read_back_is_let_go_once_the_live_memory_holds_as_many_newer_ids(chdb_client, ch_database) -> None:
    """The read-back (up to ``capacity`` ids, ~30 MB) is looked up for every record; once the sink has
    stored ``capacity`` newer ids itself, the live memory gives the same guarantee, so it is dropped."""
    audits = sample_records(90, seed=14)[Audit.topic]
    n = len(audits)
    ClickHouseSink(chdb_client, ch_database).write(Audit.topic, 0, 0, 29, audits[:30])
    restarted = ClickHouseSink(chdb_client, ch_database, apply_migrations=False)
    restarted.recent = RecentEventIds(capacity=40)
    assert len(restarted.stored_before_start) == 30
    restarted.write(Audit.topic, 0, 30, 59, audits[30:60])
    assert len(restarted.stored_before_start) == 30  # 30 newer ids stored: not yet as many as the memory holds
    restarted.write(Audit.topic, 0, 60, n - 1, audits[60:])
    assert restarted.stored_before_start == {} and len(restarted.recent) == 40


def test_a_restarted_sink_leaves_its_own_batch_redelivered_to_the_insert_token(chdb_client, ch_database) -> None:
    """A crash between the insert and the offset commit: the same batch comes again. Its records are in
    the table under this very batch's token, so the read-back must not drop them: ClickHouse's token
    check decides (it drops the repeat; an insert torn between the raw table and its rollup views is
    completed instead of skipped, which dropping by id would leave short for good)."""
    feedback = sample_records(80, seed=11)[Feedback.topic]
    n = len(feedback)
    first = ClickHouseSink(chdb_client, ch_database)
    first.write(Feedback.topic, 1, 100, 100 + n - 1, feedback)
    inserts_seen: list[int] = []
    restarted = ClickHouseSink(chdb_client, ch_database, apply_migrations=False)
    real_insert = restarted._insert_part

    def counting_insert(table, records, token):
        inserts_seen.append(len(records))
        real_insert(table, records, token)

    restarted._insert_part = counting_insert
    restarted.write(Feedback.topic, 1, 100, 100 + n - 1, feedback)
    assert inserts_seen == [n], "the redelivered batch was not handed to ClickHouse whole"
    assert restarted.recent.dropped == 0
    rows = chdb_client.query(f"SELECT count() FROM {ch_database}.feedback").result_rows[0][0]
    assert rows == n and _rollup_feedback(chdb_client, ch_database) == n  # ClickHouse dropped the repeat


def test_the_read_back_holds_the_newest_ids_of_the_window_with_their_tokens(chdb_client, ch_database) -> None:
    sink = ClickHouseSink(chdb_client, ch_database)
    records = sample_records(40, seed=10)
    ordered = sorted(records.items())
    for partition, (topic, items) in enumerate(ordered):
        sink.write(topic, partition, 0, len(items) - 1, items)
    stored = sink.stored_since(60, limit=10**6)
    assert set(stored) == {r.event_id for items in records.values() for r in items}  # every event table
    last_topic, last_items = ordered[-1]
    assert {stored[r.event_id] for r in last_items} == {f"{last_topic}/{len(ordered) - 1}/0-{len(last_items) - 1}"}
    newest = sink.stored_since(60, limit=5)
    assert len(newest) == 5 and set(newest) <= {r.event_id for r in last_items}, "not the ids inserted last"
    time.sleep(0.05)
    assert sink.stored_since(0.01, limit=10**6) == {}


def test_a_copy_with_other_content_is_dropped_and_the_stored_row_kept(chdb_client, ch_database) -> None:
    """The event id and the token the row was stored under decide, not the content: a later batch
    carrying a stored event id with another rating is a copy; the rest of that batch is stored."""
    feedback = sample_records(40, seed=12)[Feedback.topic]
    ClickHouseSink(chdb_client, ch_database).write(Feedback.topic, 2, 0, len(feedback) - 1, feedback)
    restarted = ClickHouseSink(chdb_client, ch_database, apply_migrations=False)
    changed = msgspec.structs.replace(feedback[0], rating=-5)  # same id, other content: still a copy
    fresh = sample_records(41, seed=13)[Feedback.topic][-1:]
    assert restarted.write(Feedback.topic, 2, 50, 51, [changed, *fresh]) == 1
    final = chdb_client.query(f"SELECT rating FROM {ch_database}.feedback FINAL "
                              f"WHERE event_id = '{feedback[0].event_id}'").result_rows
    assert final == [(feedback[0].rating,)]
