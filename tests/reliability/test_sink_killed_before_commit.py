"""A sink is SIGKILLed between its durable write and its offset commit (the sink's own fault hook,
``ENTROLOOP_FAULT_KILL_AFTER_WRITE``), then restarted with other batch settings: the redelivered
range is written again under the same deduplication token / object key (the write journal), so
ClickHouse and the audit log each hold every (node_id, seq) exactly once.
"""

from __future__ import annotations

import time
from pathlib import Path

from entroloop.sinks.audit.verify import verify_store

from entroloop.contract import codec
from entroloop.contract.records import Audit
from entroloop.contract.topics import partition_for
from entroloop.infra.kafka_topics import ensure_topics
from entroloop.infra.worm.worm_store import LocalWormStore
from tests.integration.acknowledged_producer import AcknowledgedProducer
from tests.reliability.harness import (
    Figures,
    all_identities,
    audit_identities,
    check_exactly_once,
    clickhouse_identities,
    clickhouse_query,
    fleet_records,
    identity,
    report,
    run_sink,
    sink_env,
    tear_newest_insert,
)

PARTITIONS = 3


def _publish(bootstrap: str, prefix: str, records: list) -> None:
    """Every record onto its topic's partition, acknowledged by the broker."""
    producer = AcknowledgedProducer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for r in records:
        producer.produce(prefix + r.topic, key=r.request_id.encode(), value=codec.encode(r),
                         partition=partition_for(r.request_id, PARTITIONS))
    assert producer.flush(60) == 0


def test_sinks_killed_between_write_and_commit(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    ensure_topics(kafka_bootstrap, topic_prefix, PARTITIONS)
    records = fleet_records(300, seed=81)
    _publish(kafka_bootstrap, topic_prefix, records)
    env = sink_env(kafka_bootstrap, topic_prefix, tmp_path, PARTITIONS)

    replayed: dict[str, int] = {}
    recovery: dict[str, float] = {}
    for kind, small, crash_at in (("clickhouse", "40", 6), ("audit", "30", 3)):
        code, _, err = run_sink(kind, env, "--batch-rows", small, "--batch-seconds", "0.2", fault_after=crash_at)
        assert code == -9, f"{kind}: the fault hook should have SIGKILLed the sink (exit {code}):\n{err[-3000:]}"
        assert f"fault: SIGKILL after durable write {crash_at}" in err
        started = time.monotonic()
        code, stats, err = run_sink(kind, env, "--batch-rows", "100000", "--batch-seconds", "5")
        recovery[kind] = time.monotonic() - started
        assert code == 0, err[-3000:]
        assert stats["replayed_rows"] > 0, f"{kind}: the restart should have rewritten the uncommitted range: {stats}"
        replayed[kind] = stats["replayed_rows"]

    sent = [identity(r) for r in records]
    sent_audit = [identity(r) for r in records if isinstance(r, Audit)]
    ch_unique, ch_twice, ch_lost = check_exactly_once(sent, all_identities(clickhouse_identities(tmp_path)), "clickhouse")
    store = LocalWormStore(tmp_path / "worm")
    au_unique, au_twice, au_lost = check_exactly_once(sent_audit, audit_identities(store), "audit")
    verdict = verify_store(store)
    report(Figures(
        "sink SIGKILLed between write and commit (clickhouse, then audit)",
        sent=len(sent),
        stored={"clickhouse": ch_unique, "audit": au_unique},
        duplicates_absorbed=sum(replayed.values()),
        lost=ch_lost + au_lost,
        recovery_s=max(recovery.values()),
        note=f"rewritten after restart: {replayed}; restart to drained: "
        + ", ".join(f"{k} {v:.1f} s" for k, v in recovery.items()) + f"; audit sent {len(sent_audit)}",
    ))
    assert ch_lost == 0 and au_lost == 0
    assert ch_twice == 0 and au_twice == 0, "a redelivered range was stored twice"
    assert verdict.ok, [str(p) for p in verdict.problems]


def test_table_batch_over_several_partitions_killed_before_commit(kafka_bootstrap: str, topic_prefix: str,
                                                                   tmp_path: Path) -> None:
    """One insert holds rows of every partition of its table (the sink batches per table): killed
    after that insert, the restarted sink rewrites the same members under the same token."""
    ensure_topics(kafka_bootstrap, topic_prefix, PARTITIONS)
    records = fleet_records(120, seed=83)
    _publish(kafka_bootstrap, topic_prefix, records)
    env = sink_env(kafka_bootstrap, topic_prefix, tmp_path, PARTITIONS)
    # rows bound far away and the records minutes old in Kafka: every table's first write is due at
    # once and takes all its partitions
    code, _, err = run_sink("clickhouse", env, "--batch-rows", "100000", "--batch-seconds", "0.5", fault_after=2)
    assert code == -9, f"the fault hook should have SIGKILLed the sink (exit {code}):\n{err[-3000:]}"
    code, stats, err = run_sink("clickhouse", env, "--batch-rows", "7", "--batch-seconds", "5")
    assert code == 0, err[-3000:]
    assert stats["replayed_rows"] > 0, stats
    # one line per journaled table batch, in no set order: a topic with a single record (one
    # fallback) has a one-partition batch, so look for any batch that names several partitions
    rewrites = [line for line in err.splitlines() if "rewriting" in line]
    assert any("), (" in line.split("rewriting", 1)[1] for line in rewrites), (
        "the journal should have named a batch of several partitions:\n" + err[-3000:])
    sent = [identity(r) for r in records]
    unique, twice, lost = check_exactly_once(sent, all_identities(clickhouse_identities(tmp_path)), "clickhouse")
    report(Figures("sink SIGKILLed after a multi-partition table insert, before its commit", sent=len(sent),
                   stored={"clickhouse": unique}, duplicates_absorbed=stats["replayed_rows"], lost=lost,
                   recovery_s=0.0, note="restarted with another batch size: the journal, not the cut, decides"))
    assert lost == 0 and twice == 0, f"lost {lost}, stored twice {twice}"


def test_sink_killed_inside_clickhouses_commit(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    """chDB runs inside the sink, so a SIGKILL can land between ClickHouse's deduplication log and
    its part rename: the restarted sink's rewrite of that batch is dropped by the token the log
    kept, and ``repair_replay`` must attach the rows the table lacks (the rollups already hold them)."""
    ensure_topics(kafka_bootstrap, topic_prefix, PARTITIONS)
    records = fleet_records(120, seed=85)
    _publish(kafka_bootstrap, topic_prefix, records)
    env = sink_env(kafka_bootstrap, topic_prefix, tmp_path, PARTITIONS)
    code, _, err = run_sink("clickhouse", env, "--batch-rows", "40", "--batch-seconds", "0.2", fault_after=4)
    assert code == -9, f"the fault hook should have SIGKILLed the sink (exit {code}):\n{err[-3000:]}"
    torn = tear_newest_insert(tmp_path)
    code, stats, err = run_sink("clickhouse", env, "--batch-rows", "100000", "--batch-seconds", "5")
    assert code == 0, err[-3000:]
    assert stats["replayed_rows"] > 0, stats
    sent = [identity(r) for r in records]
    unique, twice, lost = check_exactly_once(sent, all_identities(clickhouse_identities(tmp_path)), "clickhouse")
    rollup, raw = clickhouse_query(tmp_path, "SELECT (SELECT sum(chunks) FROM entroloop.entropy_1m), "
                                   "(SELECT count() FROM entroloop.token_entropy)")["query"][0]
    report(Figures("sink SIGKILLed inside ClickHouse's commit (chDB), then restarted", sent=len(sent),
                   stored={"clickhouse": unique}, duplicates_absorbed=stats["replayed_rows"], lost=lost,
                   recovery_s=0.0, note=f"{torn['rows']} rows of {torn['token']} lost with their token logged; "
                   f"entropy rollup {rollup} chunks, raw table {raw}"))
    assert lost == 0 and twice == 0, f"lost {lost}, stored twice {twice}"
    assert rollup == raw, f"entropy_1m counts {rollup} chunks, token_entropy holds {raw} rows"
