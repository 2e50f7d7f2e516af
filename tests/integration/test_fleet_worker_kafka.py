"""`entroloop fleet` -> Kafka -> `entroloop worker`: the same alerts as the processors give in-process,
and none lost when the worker is SIGKILLed mid-stream and restarted three times.

Derived records have deterministic event ids (entroloop.streams.base.derive), so the alerts computed here
in-process from the same synthetic traffic are exactly the set the worker must publish.
"""

from __future__ import annotations

import signal
import socket
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Consumer
from entroloop.streams.entropy_anomaly import GIBBERISH, LOOP, EntropyAnomalyDetector
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from entroloop.cli import app as cli
from entroloop.contract import codec
from entroloop.contract.records import Alert, TokenEntropy
from entroloop.contract.settings import Settings
from tests.integration.worker_process import WorkerProcess

pytestmark = pytest.mark.kafka

ENTROPY_RULES = {LOOP, GIBBERISH}


def read_token_messages(bootstrap: str, prefix: str) -> list:  # type: ignore[type-arg]
    """Every message of the prefix's TokenEntropy topic, read until it has been idle for 3 s."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"tokens-{time.time_ns()}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([prefix + TokenEntropy.topic])
    messages: list = []  # type: ignore[type-arg]
    idle_since = time.monotonic()
    while time.monotonic() - idle_since < 3.0:
        batch = consumer.consume(5000, timeout=0.5)
        if batch:
            idle_since = time.monotonic()
        messages.extend(m for m in batch if m.error() is None)
    consumer.close()
    return messages


def published_entropy_alerts(bootstrap: str, prefix: str) -> list[Alert]:
    """The alerts the detector gives in-process for the TokenEntropy records really published
    (read back from the topic: the fleet's ids are random, the derived ids are not)."""
    # The static rules: the evidence mode's bands (streams/entropy_bands.py) depend on the order in
    # which the worker consumes partitions, which a single in-process pass does not reproduce; this
    # test is about transport (the evidence itself is measured in-process by `entroloop bench detectors`).
    detector = EntropyAnomalyDetector.from_settings(Settings(entropy_evidence=False))
    tokens = [codec.decode(m.value()) for m in read_token_messages(bootstrap, prefix)]
    assert tokens, "the fleet published no TokenEntropy records"
    return [a for a in detector.process_batch(tokens) if isinstance(a, Alert)]


def missing_alerts_report(bootstrap: str, prefix: str, missing: set[str], log_path: Path) -> str:
    """Why alerts are missing, for a failure message: where each missing alert's source record sits
    (partition, offset) next to the worker group's committed offset there (committed past the
    source: the record was skipped; at or before it: the worker never got that far), and the
    worker log's warnings, errors and rebalance lines (its tail is only the shutdown)."""
    from confluent_kafka import TopicPartition

    detector = EntropyAnomalyDetector()
    source: dict[str, tuple[int, int]] = {}
    for m in read_token_messages(bootstrap, prefix):
        for alert in detector.process_batch([codec.decode(m.value())]):
            source[alert.event_id] = (m.partition(), m.offset())
    group = Consumer({"bootstrap.servers": bootstrap, "group.id": prefix + "entroloop-streams",
                      "enable.auto.commit": False})
    partitions = sorted({p for p, _ in source.values()})
    committed = {tp.partition: tp.offset for tp in group.committed(
        [TopicPartition(prefix + TokenEntropy.topic, p) for p in partitions], timeout=10)}
    group.close()
    where = sorted(source.get(event_id, (-1, -1)) for event_id in missing)
    lines = [f"{len(missing)} alerts missing; (partition, source offset, group committed offset): "
             + ", ".join(f"({p}, {o}, {committed.get(p)})" for p, o in where[:20])]
    keep = ("WARNING", "ERROR", "Traceback", "Revoking", "Setting newly", "Recovery complete", "Worker ready")
    lines += [line[:300] for line in log_path.read_text(errors="replace").splitlines()
              if any(k in line for k in keep)][-60:]
    return "\n".join(lines)


def expected_entropy_alerts(bootstrap: str, prefix: str) -> set[str]:
    """Event ids of ``published_entropy_alerts``."""
    return {a.event_id for a in published_entropy_alerts(bootstrap, prefix)}


def publish_fleet(bootstrap: str, prefix: str, requests: int, seed: int, spool: Path) -> None:
    result = CliRunner().invoke(
        cli, ["fleet", "-b", bootstrap, "--topic-prefix", prefix, "-n", str(requests), "--seed", str(seed),
              "--spool-dir", str(spool)],
    )
    assert result.exit_code == 0, result.output
    assert "dropped=0" in result.output and "delivered_all=True" in result.output, result.output


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scrape(port: int) -> dict[tuple[str, tuple], float]:
    """The worker's Prometheus metrics (ENTROLOOP_METRICS_PORT), as {(name, labels): value}."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def start_worker(bootstrap: str, prefix: str, tmp: Path, metrics_port: int = 0,
                 extra_env: dict[str, str] | None = None, module: str = "entroloop.cli",
                 role: str = "all") -> tuple[WorkerProcess, Path]:
    """``entroloop worker --role ROLE`` on ``prefix``'s topics, with short session and commit intervals
    (``module``: a test's wrapper of the CLI that injects a fault)."""
    env = {
        "ENTROLOOP_METRICS_PORT": str(metrics_port),
        "ENTROLOOP_KAFKA_BOOTSTRAP": bootstrap,
        "ENTROLOOP_TOPIC_PREFIX": prefix,
        "ENTROLOOP_DATA_DIR": str(tmp / "data"),
        "ENTROLOOP_STREAMS_SESSION_TIMEOUT_S": "6",
        "ENTROLOOP_STREAMS_BATCH_SIZE": "200",
        "ENTROLOOP_STREAMS_COMMIT_INTERVAL_S": "0.5",
        # Static entropy rules, as the in-process reference uses: the evidence mode's per-model bands
        # live in each worker's memory and depend on the order partitions are consumed, so only the
        # static rules give the worker and the reference the very same alerts (this test is about transport).
        "ENTROLOOP_ENTROPY_EVIDENCE": "false",
        **(extra_env or {}),
    }
    worker = WorkerProcess(tmp, module, "worker", "--log-level", "info", "--role", role, env=env, name=f"worker-{role}")
    return worker, worker.log_path


class AlertReader:
    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"alerts-{time.time_ns()}",
                                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
        self.consumer.subscribe([topic])
        self.ids: Counter[str] = Counter()

    def read(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            for message in self.consumer.consume(5000, timeout=min(0.3, max(left, 0.01))):
                if message.error() is None:
                    record = codec.decode(message.value())
                    if isinstance(record, Alert) and record.rule in ENTROPY_RULES:
                        self.ids[record.event_id] += 1

    def read_until_complete(self, expected: set[str], timeout: float, worker: WorkerProcess) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and worker.poll() is None:
            self.read(1.0)
            if expected <= set(self.ids):
                return True
        return False


def test_worker_publishes_exactly_the_in_process_alerts(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    publish_fleet(kafka_bootstrap, topic_prefix, 400, 11, tmp_path / "spool")
    expected = expected_entropy_alerts(kafka_bootstrap, topic_prefix)
    assert expected, "the fleet must inject some loops and gibberish"
    reader = AlertReader(kafka_bootstrap, topic_prefix + Alert.topic)
    port = free_port()
    worker, log_path = start_worker(kafka_bootstrap, topic_prefix, tmp_path, metrics_port=port)
    try:
        complete = reader.read_until_complete(expected, timeout=120, worker=worker)
        reader.read(2.0)
        metrics = scrape(port)
    finally:
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
        reader.consumer.close()
    assert complete, missing_alerts_report(kafka_bootstrap, topic_prefix, expected - set(reader.ids), log_path)
    assert set(reader.ids) == expected, "the worker published alerts the processors would not"
    assert max(reader.ids.values()) == 1, "a clean run publishes every alert once"
    # what a Prometheus scrape of the worker says agrees with what it did
    tokens = metrics[("entroloop_events_in_total", (("component", "worker"), ("topic", TokenEntropy.topic)))]
    alerts_out = metrics[("entroloop_events_out_total", (("component", "worker"), ("topic", Alert.topic)))]
    assert tokens >= 400 and alerts_out >= len(expected), (tokens, alerts_out)


@pytest.mark.reliability
def test_worker_sigkilled_three_times_loses_nothing(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    requests = 3000
    publish_fleet(kafka_bootstrap, topic_prefix, requests, 5, tmp_path / "spool")
    expected = expected_entropy_alerts(kafka_bootstrap, topic_prefix)
    reader = AlertReader(kafka_bootstrap, topic_prefix + Alert.topic)
    try:
        for kill in range(3):
            if expected <= set(reader.ids):
                # A fast worker can publish every alert before its kill lands: then there is no stream
                # left to kill in the middle of (a new worker could only republish), and asking it for
                # progress would fail on the test's timing, not on the worker.
                break
            worker, log_path = start_worker(kafka_bootstrap, topic_prefix, tmp_path)
            # Kill it mid-stream: within ~50 ms of its first new alert.
            before = len(reader.ids)
            deadline = time.monotonic() + 120
            while len(reader.ids) <= before and time.monotonic() < deadline and worker.poll() is None:
                reader.read(0.05)
            assert len(reader.ids) > before, f"kill {kill}: worker made no progress:\n{log_path.read_text()[-3000:]}"
            worker.send_signal(signal.SIGKILL)
            worker.wait(timeout=30)
        worker, log_path = start_worker(kafka_bootstrap, topic_prefix, tmp_path)
        complete = reader.read_until_complete(expected, timeout=180, worker=worker)
        reader.read(2.0)
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    finally:
        reader.consumer.close()
    stored = sum(reader.ids.values())
    lost = len(expected - set(reader.ids))
    duplicates = stored - len(reader.ids)
    print(f"\nworker SIGKILLed 3x: expected={len(expected)} stored={stored} duplicates={duplicates} lost={lost}")
    assert complete and lost == 0, missing_alerts_report(kafka_bootstrap, topic_prefix, expected - set(reader.ids),
                                                         log_path)
    assert set(reader.ids) == expected
