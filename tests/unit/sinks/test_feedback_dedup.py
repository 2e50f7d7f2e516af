"""One row per event id in the raw tables: a forged feedback that reuses a real event id (with
another error type, rating or hour) leaves the real row alone under FINAL; migration 0007 upgrades
an existing database and keeps its rows (issue 12, finding 6)."""

from __future__ import annotations

import time

import msgspec
from entroloop.sinks.clickhouse.writer import ClickHouseSink

from entroloop.contract.ids import NodeStamper
from entroloop.contract.records import Feedback
from entroloop.infra.clickhouse import schema

stamper = NodeStamper("gateway-1")
HOUR = 3600.0


def _final_rows(client, database: str) -> list[tuple]:
    return client.query(f"SELECT toString(event_id), error_type, rating FROM {database}.feedback FINAL").result_rows


def _forged(real: Feedback) -> list[Feedback]:
    """Copies of ``real`` a forger could send: same event id, other verdict, other hour or month."""
    return [
        msgspec.structs.replace(real, error_type="forged", rating=10, seq=real.seq + 1000),
        msgspec.structs.replace(real, error_type="", rating=5, emitted_at=real.emitted_at + 2 * HOUR),
        msgspec.structs.replace(real, error_type="forged", rating=9, emitted_at=real.emitted_at - 40 * 24 * HOUR),
    ]


def test_a_forged_feedback_reusing_an_event_id_leaves_one_row_the_real_one(chdb_client, ch_database):
    real = Feedback(**stamper.stamp(at=time.time() - HOUR), request_id="req-1", rating=-1, error_type="numbers")
    ClickHouseSink(chdb_client, ch_database).write(Feedback.topic, 0, 0, 0, [real])
    for n, forged in enumerate(_forged(real), start=1):
        # each from a sink that does not remember the real id (another process, or a restart past its seed window)
        ClickHouseSink(chdb_client, ch_database, apply_migrations=False, seed_window_s=0).write(Feedback.topic, 1, n, n, [forged])
    assert _final_rows(chdb_client, ch_database) == [(real.event_id, "numbers", -1)]


def test_migration_0007_upgrades_an_existing_feedback_table(chdb_client, ch_database, monkeypatch):
    every = schema.available_migrations()
    monkeypatch.setattr(schema, "available_migrations", lambda: [m for m in every if m.version < 7])
    old = ClickHouseSink(chdb_client, ch_database)
    real = [Feedback(**stamper.stamp(at=time.time() - HOUR), request_id=f"req-{i}", rating=1) for i in range(5)]
    old.write(Feedback.topic, 0, 0, 4, real)
    monkeypatch.setattr(schema, "available_migrations", lambda: [m for m in every if m.version <= 7])
    applied = schema.migrate(chdb_client, ch_database)
    assert [m.version for m in applied] == [7]
    assert sorted(r[0] for r in _final_rows(chdb_client, ch_database)) == sorted(r.event_id for r in real)
    rollup = chdb_client.query(f"SELECT sum(feedback) FROM {ch_database}.feedback_1m").result_rows[0][0]
    assert rollup == 5, "the copy into the new table must not count feedback again"
    sink = ClickHouseSink(chdb_client, ch_database, apply_migrations=False, seed_window_s=0)
    sink.write(Feedback.topic, 0, 5, 5, [Feedback(**stamper.stamp(), request_id="req-new", rating=2)])
    assert chdb_client.query(f"SELECT sum(feedback) FROM {ch_database}.feedback_1m").result_rows[0][0] == 6
    sink.write(Feedback.topic, 1, 0, 0, [msgspec.structs.replace(real[0], error_type="forged", rating=10)])
    assert (real[0].event_id, "", 1) in _final_rows(chdb_client, ch_database)
    assert len(_final_rows(chdb_client, ch_database)) == 6
