"""Two workers in one consumer group hold each durable-state key once: only on the worker that owns
its partition.

Faust's memory store keeps a standby copy of another worker's partitions in the same mapping as
the active ones, so with standby replicas a worker's processors would see, expire and report keys
that the other worker owns: early "incomplete request" dead letters, and tombstones written into
the owner's changelog partitions. Here 24 requests send their first chunk and never finish, so each
stays in the entropy detector's ``entropy_carry`` table; the two real ``entroloop worker`` processes
report how many keys they hold (``entroloop_table_entries``), which must add up to 3,000: with a
standby copy they came to 3,000 plus the standby batches applied (5,000 when measured).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from entroloop.contract.ids import NodeStamper
from entroloop.contract.records import TokenEntropy, pack_entropies
from entroloop.contract.settings import Settings
from entroloop.infra.kafka_topics import ensure_topics
from tests.integration.test_bad_case_join_restart import (
    APP_ID,
    committed_total,
    publish,
)
from tests.integration.test_fleet_worker_kafka import free_port, scrape, start_worker

pytestmark = pytest.mark.kafka

REQUESTS = 3000
"""Faust applies a standby's changelog records to the store in batches of ``standby_buffer_size``
(1000 by default): enough keys that each worker's standby copy would take several batches."""
TABLE = "entropy_carry"


def members_reading(bootstrap: str, group: str, topic: str) -> int:
    """How many members of a stable ``group`` have partitions of ``topic`` assigned (0 while it rebalances)."""
    from confluent_kafka import ConsumerGroupState
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        description = admin.describe_consumer_groups([group], request_timeout=10)[group].result()
    except Exception:  # noqa: BLE001 - the group does not exist yet
        return 0
    if description.state != ConsumerGroupState.STABLE:
        return 0
    return sum(any(tp.topic == topic for tp in member.assignment.topic_partitions) for member in description.members)


def held(port: int) -> float | None:
    """Keys this worker reports in its entropy_carry table (None before its first report)."""
    try:
        metrics = scrape(port)
    except OSError:
        return None
    return metrics.get(("entroloop_table_entries", (("component", "worker"), ("table", TABLE))))


def test_two_workers_hold_each_state_key_once(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    settings = Settings()
    ensure_topics(kafka_bootstrap, topic_prefix, settings.partitions)
    stamper, now = NodeStamper("node-ownership"), time.time()
    unfinished = [TokenEntropy(**{**stamper.stamp(), "emitted_at": now}, request_id=f"open-{i}", model="m",
                               entropies=pack_entropies([3.0] * 40), chunk_index=0, final=False)
                  for i in range(REQUESTS)]
    fast = {"ENTROLOOP_STREAMS_HEALTH_INTERVAL_S": "0.5"}
    ports = [free_port(), free_port()]
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    workers = [start_worker(kafka_bootstrap, topic_prefix, tmp_path / name, port, fast)
               for name, port in zip(("a", "b"), ports)]
    try:
        # both in the group before the records come, so the partitions are split between them
        deadline = time.monotonic() + 90
        tokens = topic_prefix + TokenEntropy.topic
        while members_reading(kafka_bootstrap, topic_prefix + APP_ID, tokens) < 2:
            for worker, log in workers:
                assert worker.poll() is None, f"worker died:\n{log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, "the workers never both got partitions"
            time.sleep(0.5)
        time.sleep(2)  # the last rebalance settles
        publish(kafka_bootstrap, topic_prefix, unfinished)
        deadline = time.monotonic() + 90
        while committed_total(kafka_bootstrap, topic_prefix + APP_ID, tokens, settings.partitions) < REQUESTS:
            assert time.monotonic() < deadline, "the records were not all committed:\n" + "\n".join(
                log.read_text()[-2000:] for _, log in workers)
            time.sleep(0.5)
        # Long enough for a standby copy to catch up from the changelog, sampled all along.
        samples = []
        until = time.monotonic() + 8
        while time.monotonic() < until:
            samples.append(tuple(held(port) or 0.0 for port in ports))
            time.sleep(0.5)
    finally:
        for worker, _ in workers:
            worker.send_signal(signal.SIGTERM)
        for worker, _ in workers:
            worker.wait(timeout=60)
    final = samples[-1]
    assert sum(final) == REQUESTS, f"keys held per worker over time (each key once: {REQUESTS} in all): {samples}"
    assert min(final) > 0, f"one worker got every partition, the test shows nothing: {samples}"
