"""The real ``entroloop worker`` keeps the bad-case join under ``ENTROLOOP_BADCASE_JOIN_MAX_REQUESTS``
and says how many requests it dropped for it (``entroloop_table_evicted``): every audit enters that
table, so before the bound its memory and changelog grew with all traffic for the join's TTL."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from entroloop.contract.ids import NodeStamper
from entroloop.contract.records import Audit
from entroloop.contract.settings import Settings
from entroloop.infra.kafka_topics import ensure_topics
from tests.integration.test_bad_case_join_restart import (
    APP_ID,
    committed_total,
    publish,
)
from tests.integration.test_fleet_worker_kafka import free_port, scrape, start_worker

pytestmark = pytest.mark.kafka

BOUND = 50
AUDITS = 400
TABLE = (("component", "worker"), ("table", "bad_case_join"))


def _audits(stamper: NodeStamper, first: int, count: int, at: float) -> list[Audit]:
    return [Audit(**{**stamper.stamp(), "emitted_at": at + i * 0.001}, request_id=f"req-{i}", audit_id=f"a-{i}",
                  model="m", prompt="余额多少?", response="您的余额为120.00元。") for i in range(first, first + count)]


def test_the_worker_holds_at_most_the_bound_and_counts_what_it_dropped(kafka_bootstrap: str, topic_prefix: str,
                                                                        tmp_path: Path) -> None:
    settings = Settings()
    ensure_topics(kafka_bootstrap, topic_prefix, settings.partitions)
    port = free_port()
    worker, log = start_worker(kafka_bootstrap, topic_prefix, tmp_path, port, {
        "ENTROLOOP_BADCASE_JOIN_MAX_REQUESTS": str(BOUND), "ENTROLOOP_STREAMS_HEALTH_INTERVAL_S": "0.5"})
    stamper, now = NodeStamper("node-bound"), time.time()
    try:
        publish(kafka_bootstrap, topic_prefix, _audits(stamper, 0, AUDITS, now))
        audits_topic = topic_prefix + Audit.topic
        deadline = time.monotonic() + 90
        while committed_total(kafka_bootstrap, topic_prefix + APP_ID, audits_topic, settings.partitions) < AUDITS:
            assert worker.poll() is None, f"worker died:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"the audits were not all committed:\n{log.read_text()[-3000:]}"
            time.sleep(0.5)
        # one more audit later: a watermark after the last batch (at most one per interval) applies the bound
        time.sleep(1.0)
        publish(kafka_bootstrap, topic_prefix, _audits(stamper, AUDITS, 1, now + 1.0))
        seen: dict[str, float | None] = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            metrics = scrape(port)
            seen = {"entries": metrics.get(("entroloop_table_entries", TABLE)),
                    "evicted": metrics.get(("entroloop_table_evicted_total", TABLE))}
            if seen == {"entries": BOUND, "evicted": AUDITS + 1 - BOUND}:
                break
            time.sleep(0.5)
        assert seen == {"entries": BOUND, "evicted": AUDITS + 1 - BOUND}, (
            f"metrics {seen}; worker log:\n{log.read_text()[-3000:]}")
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
