"""Migrations (fresh and upgrade), per-minute rollups equal to raw queries, idempotent redelivery.

All against real ClickHouse SQL in chDB. chDB holds one data folder per process, so the tests
share the session's folder and each works in a database of its own.
"""

from __future__ import annotations

import math
import time
import uuid
from collections import Counter

import pytest
from entroloop.sinks.clickhouse.writer import ClickHouseSink

from entroloop.contract.topics import TOPIC_BY_NAME
from entroloop.infra.clickhouse.schema import (
    Migration,
    MigrationError,
    applied_migrations,
    available_migrations,
    migrate,
)
from tests.unit.sinks.sink_records import sample_records

ROLLUP_TABLES = (
    "entropy_1m", "latency_1m", "similarity_1m", "anomalies_1m",
    "fallbacks_1m", "bad_cases_1m", "requests_1m", "feedback_1m",
)


@pytest.fixture(scope="module")
def client(chdb_client: object) -> object:
    """The session's chDB (one folder per process; see tests/conftest.py)."""
    return chdb_client


@pytest.fixture
def database(client: object) -> str:
    return f"t_{uuid.uuid4().hex[:12]}"


def _write_all(sink: ClickHouseSink, records: dict[str, list], batch: int = 40, partition: int = 0) -> None:
    """Write each topic in offset-aligned batches, as the runner and the Kafka sinks do."""
    for topic, items in records.items():
        for first in range(0, len(items), batch):
            chunk = items[first : first + batch]
            sink.write(topic, partition, first, first + len(chunk) - 1, chunk)


def _rows(client, sql: str) -> list[tuple]:
    return [tuple(r) for r in client.query(sql).result_rows]


# Each pair: (query on a rollup table, the same question asked of the raw table).
EXACT_PAIRS = {
    "entropy": (
        "SELECT minute, model, route, adapter, node_id, sum(chunks), sum(requests), sum(tokens), "
        "round(sum(entropy_sum), 3), max(max_entropy) FROM {db}.entropy_1m "
        "GROUP BY minute, model, route, adapter, node_id ORDER BY ALL",
        "SELECT toStartOfMinute(emitted_at) AS minute, model, route, adapter, node_id, count(), countIf(final), "
        "sum(length(entropies)), round(sum(toFloat64(arraySum(entropies))), 3), max(max_entropy) "
        "FROM {db}.token_entropy FINAL GROUP BY minute, model, route, adapter, node_id ORDER BY ALL",
    ),
    "latency": (
        "SELECT minute, model, route, node_id, name, sum(spans), sum(errors), sum(output_tokens), max(e2e_max) "
        "FROM {db}.latency_1m GROUP BY minute, model, route, node_id, name ORDER BY ALL",
        "SELECT toStartOfMinute(emitted_at) AS minute, model, route, node_id, name, count(), countIf(status != 'ok'), "
        "sum(ifNull(output_tokens, 0)), max(ifNull(e2e_s, 0)) FROM {db}.spans FINAL "
        "GROUP BY minute, model, route, node_id, name ORDER BY ALL",
    ),
    "similarity": (
        "SELECT minute, model, route, language, sum(scores), sum(below_threshold), round(sum(similarity_sum), 4) "
        "FROM {db}.similarity_1m GROUP BY ALL ORDER BY ALL",
        "SELECT toStartOfMinute(emitted_at) AS minute, model, route, language, count(), countIf(similarity < threshold), "
        "round(sum(toFloat64(similarity)), 4) FROM {db}.intent_scores FINAL GROUP BY ALL ORDER BY ALL",
    ),
    "anomalies": (
        "SELECT minute, rule, severity, model, route, subject_node, sum(alerts), max(max_value) "
        "FROM {db}.anomalies_1m GROUP BY ALL ORDER BY ALL",
        "SELECT toStartOfMinute(emitted_at) AS minute, rule, severity, model, route, subject_node, count(), max(value) "
        "FROM {db}.alerts FINAL GROUP BY ALL ORDER BY ALL",
    ),
    "fallbacks": (
        "SELECT minute, model, route, reason, from_tier, to_tier, sum(fallbacks) FROM {db}.fallbacks_1m "
        "GROUP BY ALL ORDER BY ALL",
        "SELECT toStartOfMinute(emitted_at) AS minute, model, route, reason, from_tier, to_tier, count() "
        "FROM {db}.fallbacks FINAL GROUP BY ALL ORDER BY ALL",
    ),
    "bad_cases": (
        "SELECT minute, model, route, adapter, sum(bad_cases), round(sum(confidence_sum), 4) FROM {db}.bad_cases_1m "
        "GROUP BY ALL ORDER BY ALL",
        "SELECT toStartOfMinute(emitted_at) AS minute, model, route, adapter, count(), round(sum(toFloat64(confidence)), 4) "
        "FROM {db}.bad_cases FINAL GROUP BY ALL ORDER BY ALL",
    ),
    "requests": (
        "SELECT minute, model, route, adapter, prompt_template_version, tenant, sum(requests), sum(prompt_chars), "
        "sum(response_chars) FROM {db}.requests_1m GROUP BY ALL ORDER BY ALL",
        "SELECT toStartOfMinute(emitted_at) AS minute, model, route, adapter, prompt_template_version, tenant, count(), "
        "sum(prompt_chars), sum(response_chars) FROM {db}.audit_index FINAL GROUP BY ALL ORDER BY ALL",
    ),
    "feedback": (
        "SELECT minute, error_type, rating, sum(feedback), sum(corrections) "
        "FROM {db}.feedback_1m GROUP BY ALL ORDER BY ALL",
        "SELECT toStartOfMinute(emitted_at) AS minute, error_type, rating, count(), countIf(has_correction) "
        "FROM {db}.feedback FINAL GROUP BY ALL ORDER BY ALL",
    ),
}

# Sketch quantiles against exact quantiles of the raw rows, per model (t-digest is approximate).
QUANTILE_PAIRS = {
    "mean_entropy": (
        "SELECT model, quantilesTDigestMerge(0.5, 0.9)(mean_entropy_q) FROM {db}.entropy_1m GROUP BY model ORDER BY model",
        "SELECT model, quantilesExact(0.5, 0.9)(mean_entropy) FROM {db}.token_entropy FINAL GROUP BY model ORDER BY model",
    ),
    "ttft": (
        "SELECT model, quantilesTDigestMerge(0.5, 0.9)(ttft_q) FROM {db}.latency_1m GROUP BY model ORDER BY model",
        "SELECT model, quantilesExact(0.5, 0.9)(ttft_s) FROM {db}.spans FINAL WHERE ttft_s IS NOT NULL GROUP BY model ORDER BY model",
    ),
    "e2e": (
        "SELECT model, quantilesTDigestMerge(0.5, 0.99)(e2e_q) FROM {db}.latency_1m GROUP BY model ORDER BY model",
        "SELECT model, quantilesExact(0.5, 0.99)(e2e_s) FROM {db}.spans FINAL WHERE e2e_s IS NOT NULL GROUP BY model ORDER BY model",
    ),
    "similarity": (
        "SELECT model, quantilesTDigestMerge(0.5, 0.9)(similarity_q) FROM {db}.similarity_1m GROUP BY model ORDER BY model",
        "SELECT model, quantilesExact(0.5, 0.9)(similarity) FROM {db}.intent_scores FINAL GROUP BY model ORDER BY model",
    ),
}


def _assert_rollups_match_raw(client, db: str) -> None:
    for name, (rollup_sql, raw_sql) in EXACT_PAIRS.items():
        rollup, raw = _rows(client, rollup_sql.format(db=db)), _rows(client, raw_sql.format(db=db))
        assert raw, f"{name}: the raw table is empty, the comparison would prove nothing"
        assert rollup == raw, f"{name}: rollup differs from raw"
    for name, (rollup_sql, raw_sql) in QUANTILE_PAIRS.items():
        rollup, raw = _rows(client, rollup_sql.format(db=db)), _rows(client, raw_sql.format(db=db))
        assert [r[0] for r in rollup] == [r[0] for r in raw], name
        for (model, sketch), (_, exact) in zip(rollup, raw):
            spread = max(exact) - min(exact) or 1.0
            for s, e in zip(sketch, exact):
                # t-digest error is a small fraction of the value range at these sizes
                assert math.isclose(s, e, abs_tol=0.08 * spread), f"{name}/{model}: sketch {sketch} vs exact {exact}"


def test_fresh_migration_creates_every_rollup_and_records_versions(client, database):
    applied = migrate(client, database)
    assert [m.version for m in applied] == [m.version for m in available_migrations()]
    assert {1, 2} <= set(applied_migrations(client, database))
    tables = {r[0] for r in _rows(client, f"SELECT name FROM system.tables WHERE database = '{database}'")}
    for table in ROLLUP_TABLES:
        assert table in tables and f"{table}_mv" in tables
    assert migrate(client, database) == []  # a second run applies nothing


def test_rollups_equal_raw_queries(client, database):
    sink = ClickHouseSink(client, database)
    _write_all(sink, sample_records(600, seed=3))
    _assert_rollups_match_raw(client, database)


def test_feedback_rows_keep_the_tenant_that_posted_them(client, database):
    """Migration 0009: the sink stores ``Feedback.tenant`` (the key's tenant), '' where none was set."""
    records = sample_records(120, seed=9)
    ClickHouseSink(client, database).write("entroloop.feedback.v1", 0, 0, len(records["entroloop.feedback.v1"]) - 1,
                                           records["entroloop.feedback.v1"])
    expected = sorted(Counter(r.tenant for r in records["entroloop.feedback.v1"]).items())
    assert {t for t, _ in expected} == {"acme", "globex", ""}
    assert _rows(client, f"SELECT tenant, count() FROM {database}.feedback FINAL GROUP BY tenant ORDER BY tenant") == expected


def test_upgrade_from_0001_backfills_rollups(client, database, monkeypatch):
    """A database created and filled at 0001 is upgraded to 0002: rollups cover the old rows too."""
    only_first = [m for m in available_migrations() if m.version == 1]
    monkeypatch.setattr("entroloop.infra.clickhouse.schema.available_migrations", lambda: only_first)
    sink = ClickHouseSink(client, database)
    old = sample_records(300, seed=5)
    _write_all(sink, old)
    assert set(applied_migrations(client, database)) == {1}
    monkeypatch.undo()

    applied = migrate(client, database)
    assert [m.version for m in applied] == [m.version for m in available_migrations() if m.version > 1]
    new = sample_records(300, seed=6, start=time.time() - 600)  # rows after the upgrade go through the views
    _write_all(ClickHouseSink(client, database, apply_migrations=False), new, partition=1)
    _assert_rollups_match_raw(client, database)
    total = _rows(client, f"SELECT sum(requests) FROM {database}.requests_1m")[0][0]
    assert total == len(old[TOPIC_BY_NAME["entroloop.audit.v1"].name]) + len(new["entroloop.audit.v1"])


def test_upgrade_to_0004_recompresses_entropies_and_keeps_old_rows(client, database, monkeypatch):
    """0004 only changes the entropies codec: rows written before it read back unchanged."""
    before_0004 = [m for m in available_migrations() if m.version < 4]
    monkeypatch.setattr("entroloop.infra.clickhouse.schema.available_migrations", lambda: before_0004)
    sink = ClickHouseSink(client, database)
    old = sample_records(200, seed=11)
    _write_all(sink, old)
    monkeypatch.undo()
    sql = f"SELECT event_id, entropies FROM {database}.token_entropy FINAL ORDER BY event_id"
    stored = _rows(client, sql)

    assert [m.version for m in migrate(client, database)][0] == 4  # later migrations follow it
    codec = _rows(client, f"SELECT compression_codec FROM system.columns WHERE database = '{database}' "
                          "AND table = 'token_entropy' AND name = 'entropies'")
    assert codec == [("CODEC(ZSTD(1))",)]
    client.command(f"OPTIMIZE TABLE {database}.token_entropy FINAL")  # rewrites the parts with the new codec
    assert _rows(client, sql) == stored and len(stored) == len(old["entroloop.tokens.v1"])
    _assert_rollups_match_raw(client, database)


def test_redelivered_batches_do_not_double_count(client, database):
    sink = ClickHouseSink(client, database)
    records = sample_records(400, seed=8)
    _write_all(sink, records)
    before = {t: _rows(client, f"SELECT * FROM {database}.{t} FINAL ORDER BY ALL") for t in ("fallbacks_1m",)}
    sums = _rows(client, f"SELECT sum(requests) FROM {database}.requests_1m")
    _write_all(sink, records)  # the whole stream again: same batches, same tokens
    _write_all(sink, records)
    assert _rows(client, f"SELECT sum(requests) FROM {database}.requests_1m") == sums
    assert sums[0][0] == len(records["entroloop.audit.v1"])
    # raw tables hold one set of rows without FINAL: the inserts were dropped, not merged away
    raw = _rows(client, f"SELECT count() FROM {database}.token_entropy")[0][0]
    assert raw == len(records["entroloop.tokens.v1"])
    assert {t: _rows(client, f"SELECT * FROM {database}.{t} FINAL ORDER BY ALL") for t in before} == before
    _assert_rollups_match_raw(client, database)


def test_edited_applied_migration_is_refused(client, database, monkeypatch):
    migrate(client, database)
    edited = [Migration(m.version, m.name, m.sql + "\n-- edited") for m in available_migrations()]
    monkeypatch.setattr("entroloop.infra.clickhouse.schema.available_migrations", lambda: edited)
    with pytest.raises(MigrationError, match="edited after it was applied"):
        migrate(client, database)


def test_batcher_inserts_each_topic_once_and_a_redelivered_cut_is_dropped(client, database):
    from entroloop.sinks.batching import SinkBatcher

    audits = sample_records(90, seed=9)["entroloop.audit.v1"]
    inserts = 0
    for attempt in range(2):  # the second pass is a redelivery of the same offsets to a restarted sink
        sink = ClickHouseSink(client, database)  # new process: its memory of recent ids is empty
        batcher = SinkBatcher(sink, max_rows=1000, max_seconds=1.0)
        for partition in range(3):
            part = audits[partition * 30 : (partition + 1) * 30]
            batcher.add("entroloop.audit.v1", partition, 0, len(part) - 1, part)
        committed = batcher.flush_all()
        assert sorted(committed) == [("entroloop.audit.v1", p, 30) for p in range(3)]
        inserts += sink.inserts
    assert inserts == 2  # one insert per flush holding all three partitions; ClickHouse drops the second
    assert _rows(client, f"SELECT count() FROM {database}.audit_index")[0][0] == 90
    assert _rows(client, f"SELECT sum(requests) FROM {database}.requests_1m")[0][0] == 90


def test_prefixed_targets_sharing_a_database_keep_apart_and_drop_their_own_redelivery(client, database):
    """Two deployments (topic prefixes) write equal offsets into one database: neither token matches the other."""
    from entroloop.sinks.kafka_sink import PrefixedClickHouseTarget

    sink = ClickHouseSink(client, database)
    topic = "entroloop.spans.v1"
    first, second = sample_records(20, seed=13)[topic], sample_records(20, seed=14)[topic]
    first, second = first[:20], second[:20]
    PrefixedClickHouseTarget(sink, "tenant-a.").write(topic, 0, 0, 19, first)
    PrefixedClickHouseTarget(sink, "tenant-b.").write(topic, 0, 0, 19, second)
    restarted = ClickHouseSink(client, database)  # a new process: only the token can drop the copy
    PrefixedClickHouseTarget(restarted, "tenant-a.").write(topic, 0, 0, 19, first)  # redelivered: dropped
    assert _rows(client, f"SELECT count() FROM {database}.spans")[0][0] == 40
    assert sink.inserts == 2 and restarted.inserts == 1 and sink.stage_seconds["insert"] > 0
