"""The local spool reaches its disk limit while no broker answers: the publisher says so loudly (an
ERROR log line with the count) and counts every dropped record; nothing is lost silently — sent =
delivered later from the spool + dropped, exactly.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer
from entroloop.collectors.publisher import Publisher, PublisherConfig

from entroloop.contract import codec
from entroloop.infra.kafka_topics import ensure_topics
from tests.reliability.harness import (
    Figures,
    fleet_records,
    free_port,
    identity,
    report,
)

SPOOL_LIMIT = 256 * 1024


def consume_identities(bootstrap: str, prefix: str, expected: int, timeout: float = 60) -> Counter:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"spool-{uuid.uuid4().hex}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    topics = [t for t in consumer.list_topics(timeout=10).topics if t.startswith(prefix)]
    consumer.subscribe(topics)
    seen: Counter = Counter()
    deadline = time.monotonic() + timeout
    idle_since = time.monotonic()
    while time.monotonic() < deadline and (sum(seen.values()) < expected or time.monotonic() - idle_since < 2):
        messages = consumer.consume(5000, timeout=0.5)
        if messages:
            idle_since = time.monotonic()
        for m in messages:
            if m.error() is None:
                seen[identity(codec.decode(m.value()))] += 1
    consumer.close()
    return seen


def test_spool_at_its_disk_limit_is_reported_loudly_with_counts(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    records = fleet_records(1500, seed=61)
    spool_dir = tmp_path / "spool"
    nowhere = f"127.0.0.1:{free_port()}"  # nothing listens: every record must go to the spool
    caplog.set_level(logging.WARNING, logger="entroloop.collectors.publisher")
    offline = Publisher(PublisherConfig(nowhere, spool_dir, topic_prefix=topic_prefix, spool_max_bytes=SPOOL_LIMIT,
                                        delivery_timeout_ms=1000))
    for record in records:
        offline.publish(record)
    time.sleep(2.0)  # the background thread notices the outage and spools what is still queued
    stats = offline.close(timeout=10)
    dropped, spooled = stats["dropped"], stats["spooled"]
    drop_lines = [r for r in caplog.records if r.levelno >= logging.ERROR and "DROPPING" in r.getMessage()]
    assert dropped > 0, f"the spool limit should have been reached: {stats}"
    assert drop_lines, "dropping must be logged as an error"
    assert str(dropped) in drop_lines[-1].getMessage() or "dropped so far" in drop_lines[-1].getMessage()
    assert spooled + dropped == len(records), stats
    assert stats["spool_bytes"] <= SPOOL_LIMIT

    # The broker is back: a new publisher on the same folder replays the spool left behind.
    ensure_topics(kafka_bootstrap, topic_prefix)
    started = time.monotonic()
    online = Publisher(PublisherConfig(kafka_bootstrap, spool_dir, topic_prefix=topic_prefix))
    assert online.flush(120)
    deadline = time.monotonic() + 60
    while online.stats()["spool_bytes"] and time.monotonic() < deadline:
        time.sleep(0.2)
    recovery_s = time.monotonic() - started
    replay = online.close()
    stored = consume_identities(kafka_bootstrap, topic_prefix, spooled)
    sent = {identity(r) for r in records}
    assert set(stored) <= sent
    unique = len(stored)
    report(Figures(
        f"spool full ({SPOOL_LIMIT // 1024} KiB limit), broker unreachable",
        sent=len(records),
        stored={"kafka (replayed from spool)": unique},
        duplicates_absorbed=sum(stored.values()) - unique,
        lost=len(records) - unique,
        recovery_s=recovery_s,
        note=f"reported: dropped={dropped} (ERROR log: {drop_lines[-1].getMessage()[:90]!r}), spooled={spooled}, "
        f"replayed={replay['replayed']}",
    ))
    assert unique == spooled, "every spooled record must be delivered after the outage"
    assert len(records) - unique == dropped, "every lost record must be counted as dropped"
    assert max(stored.values()) == 1
