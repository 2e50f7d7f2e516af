"""A copy of an event that arrives again at another offset (a publisher's spool replay after an
ambiguous delivery timeout) is stored once: one raw ClickHouse row, one audit row, a gap-free chain.
"""

from __future__ import annotations

from pathlib import Path

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
