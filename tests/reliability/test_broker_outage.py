"""The broker stops and restarts while the fleet publishes: the node publisher spools, replays, and
both sinks end with every (node_id, seq) exactly once.

The broker is the harness's own (``DedicatedBroker``), so stopping it does not disturb other tests.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from entroloop.collectors.publisher import Publisher, PublisherConfig
from entroloop.sinks.audit.verify import verify_store

from entroloop.contract.records import Audit
from entroloop.infra.kafka_topics import ensure_topics
from entroloop.infra.worm.worm_store import LocalWormStore
from tests.reliability.harness import (
    DedicatedBroker,
    Figures,
    all_identities,
    audit_identities,
    check_exactly_once,
    clickhouse_identities,
    fleet_records,
    identity,
    report,
    run_sink,
    sink_env,
    topic_messages,
    wait_for,
)

PARTITIONS = 3
PUBLISH_SECONDS = 12.0


def test_broker_stopped_and_restarted_while_the_fleet_publishes(tmp_path: Path) -> None:
    broker = DedicatedBroker(tmp_path / "kafka")
    try:
        broker.start()
        prefix = "outage."
        ensure_topics(broker.bootstrap, prefix, PARTITIONS)
        records = fleet_records(600, seed=41)
        publisher = Publisher(PublisherConfig(broker.bootstrap, tmp_path / "spool", topic_prefix=prefix,
                                              delivery_timeout_ms=3000))
        published = threading.Event()

        def publish_steadily() -> None:  # the fleet at a steady rate, as serving nodes would
            started = time.monotonic()
            for i, record in enumerate(records):
                ahead = i * PUBLISH_SECONDS / len(records) - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
                publisher.publish(record)
            published.set()

        thread = threading.Thread(target=publish_steadily, daemon=True)
        thread.start()
        time.sleep(3.0)
        broker.stop()
        time.sleep(4.0)  # publishing goes on against a dead broker
        broker.start()
        back_at = time.monotonic()
        thread.join(timeout=120)
        assert published.is_set()
        assert publisher.flush(120), f"not everything was delivered after the restart: {publisher.stats()}"
        recovery_s = time.monotonic() - back_at
        # caught up: nothing queued, nothing left in the spool
        wait_for(lambda: publisher.stats()["spool_bytes"] == 0, 60, what="an empty spool")
        stats = publisher.close()
        assert stats["dropped"] == 0, stats
        assert stats["spooled"] > 0, f"the outage should have sent records to the spool: {stats}"

        in_kafka = topic_messages(broker.bootstrap, prefix)
        env = sink_env(broker.bootstrap, prefix, tmp_path / "sinks", PARTITIONS)
        for kind in ("clickhouse", "audit"):
            code, sink_stats, err = run_sink(kind, env)
            assert code == 0, f"sink {kind} failed:\n{err[-3000:]}"
    finally:
        broker.stop(kill=True)

    sent = [identity(r) for r in records]
    sent_audit = [identity(r) for r in records if isinstance(r, Audit)]
    stored_ch = all_identities(clickhouse_identities(tmp_path / "sinks"))
    ch_unique, ch_twice, ch_lost = check_exactly_once(sent, stored_ch, "clickhouse")
    store = LocalWormStore(tmp_path / "sinks" / "worm")
    audit_unique, audit_twice, audit_lost = check_exactly_once(sent_audit, audit_identities(store), "audit")
    verdict = verify_store(store)
    report(Figures(
        "broker stopped 4 s and restarted while publishing",
        sent=len(sent),
        stored={"clickhouse": ch_unique, "audit": audit_unique},
        duplicates_absorbed=in_kafka - len(sent),
        lost=ch_lost + audit_lost,
        recovery_s=recovery_s,
        note=f"{stats['delivery_errors']} delivery errors; publisher spooled {stats['spooled']}, replayed {stats['replayed']}; audit sent {len(sent_audit)}",
    ))
    assert in_kafka >= len(sent)
    assert ch_lost == 0 and audit_lost == 0
    assert ch_twice == 0 and audit_twice == 0, "an event was stored twice"
    assert verdict.ok, [str(p) for p in verdict.problems]
