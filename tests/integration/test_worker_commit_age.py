"""The worker's ``last_commit_age_s`` health against a real broker: small while commits succeed,
growing while they are blocked (a record stays in flight, so the strict commit cannot move).

Before the fix the age came from a sensor Faust never called and grew from start-up while commits
succeeded; the first test fails on that.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from entroloop.contract import codec
from entroloop.contract.ids import NodeStamper
from entroloop.contract.records import Alert, Feedback, Health
from entroloop.infra.kafka_topics import ensure_topics
from tests.integration.test_streams_worker_kafka import (
    TOPICS,
    TopicReader,
    Worker,
    seen_alerts,
)

pytestmark = pytest.mark.kafka


def _publish_steadily(bootstrap: str, topic: str, stop: threading.Event, first_slow: bool) -> None:
    """One Feedback every 100 ms until ``stop``; the first one is the slow one when ``first_slow``."""
    stamper = NodeStamper("node-commit-age")
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0})
    i = 0
    while not stop.is_set():
        record = Feedback(**stamper.stamp(), request_id="slow" if first_slow and i == 0 else f"req-{i}", rating=-1)
        producer.produce(topic, codec.encode(record), record.request_id.encode())
        producer.poll(0)
        i += 1
        stop.wait(0.1)
    producer.flush(10)


def _ages(bootstrap: str, prefix: str, tmp: Path, slow_id: str, seconds: float) -> tuple[list[tuple[float, float]], int]:
    """(time, last_commit_age_s) of every Health record published during ``seconds`` after the
    worker processed its first record, and how many alerts it produced."""
    ensure_topics(bootstrap, prefix, partitions=1, topics=TOPICS)
    health = TopicReader(bootstrap, prefix + Health.topic)
    alerts = TopicReader(bootstrap, prefix + Alert.topic)
    stop = threading.Event()
    publisher = threading.Thread(target=_publish_steadily, args=(bootstrap, prefix + Feedback.topic, stop,
                                                                 slow_id == "slow"), daemon=True)
    worker = Worker(tmp, bootstrap, prefix, slow_id, "120", "1")
    publisher.start()
    try:
        if slow_id == "slow":  # nothing is processed after the slow head: wait for the worker's health
            assert health.read_until(lambda rs: any(isinstance(r, Health) for r in rs), 90), worker.log_tail()
        else:
            assert alerts.read_until(lambda rs: len(seen_alerts(rs)) >= 1, 90), worker.log_tail()
        started = time.time()
        health.records.clear()
        health.read_until(lambda rs: False, seconds)
        alerts.read_until(lambda rs: len(seen_alerts(rs)) >= 30, 5 if slow_id != "slow" else 1)
    finally:
        stop.set()
        publisher.join(10)
        worker.kill()
        health.close()
        alerts.close()
    ages = [(r.emitted_at, r.value) for r in health.records
            if isinstance(r, Health) and r.metric == "last_commit_age_s" and r.emitted_at >= started]
    return ages, len(seen_alerts(alerts.records))


def test_commit_age_stays_small_while_commits_succeed(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    ages, alerts = _ages(kafka_bootstrap, topic_prefix, tmp_path, "none", seconds=10)
    assert len(ages) >= 5, ages  # health every second
    assert alerts >= 30  # events flowed (~10 a second), so the commits had work to do
    # Commits every 0.3 s; the age may include one health interval of work waiting for a commit.
    assert max(age for _, age in ages) < 2.5, ages


def test_commit_age_grows_while_commits_are_blocked(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    ages, alerts = _ages(kafka_bootstrap, topic_prefix, tmp_path, "slow", seconds=10)
    assert len(ages) >= 5, ages
    assert alerts == 0  # the slow head holds the partition: nothing after it is processed or committed
    values = [age for _, age in sorted(ages)]
    assert values == sorted(values), values  # it only grows
    assert values[-1] - values[0] >= 6, values  # about as fast as the wall clock
    assert values[-1] >= 8, values
