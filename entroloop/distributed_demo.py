"""`entroloop demo --broker`: the demo through real Kafka, with the real worker and sink processes.

The fleet publishes through the serving-node publisher onto a fresh topic prefix; one
`entroloop worker` process runs the processors until every input topic is consumed and the
topics stop growing; then the ClickHouse and audit sinks run as processes until they have
committed everything, `entroloop actions` runs the runbooks of every alert, and the sinks store
its Action records; the verdict is read back from their storage exactly as the embedded
demo's is. Each stage is a separate process talking only through Kafka, as in production.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, Producer, TopicPartition

from entroloop.collectors.publisher import Publisher
from entroloop.collectors.synthetic_fleet import SyntheticFleet, malformed_payloads
from entroloop.contract import codec
from entroloop.contract.records import Fallback, TokenEntropy
from entroloop.contract.settings import Settings
from entroloop.contract.topics import TOPIC_BY_TYPE, TOPICS
from entroloop.demo_summary import FleetTruth, summarize
from entroloop.infra.clickhouse.client import connect
from entroloop.infra.kafka_topics import ensure_topics
from entroloop.infra.worm.stores import open_worm_store
from entroloop.streams.defaults import default_processors

STREAMS_GROUP = "entroloop-streams"  # streams.app's Faust app id
IDLE_S = 6.0


def _cli(*args: str, env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "ab") as fh:
        return subprocess.Popen([sys.executable, "-m", "entroloop.cli", *args], env=env, stdout=fh, stderr=fh)


def _watermarks(consumer: Consumer, topics: list[str], partitions: int) -> dict[tuple[str, int], int]:
    return {
        (t, p): consumer.get_watermark_offsets(TopicPartition(t, p), timeout=10)[1]
        for t in topics
        for p in range(partitions)
    }


def _wait_for_worker(bootstrap: str, topics: list[str], group: str, partitions: int, timeout_s: float,
                     status: Callable[[str], None]) -> None:
    """Until the worker's group has committed every offset of its input topics and no topic grew
    for IDLE_S (its outputs feed other processors, so one quiet moment is not enough)."""
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        deadline, last, stable_since = time.monotonic() + timeout_s, None, time.monotonic()
        while time.monotonic() < deadline:
            ends = _watermarks(probe, topics, partitions)
            committed = probe.committed([TopicPartition(t, p) for t, p in ends], timeout=10)
            lag = sum(ends[(tp.topic, tp.partition)] - max(tp.offset, 0) for tp in committed)
            if ends != last:
                last, stable_since = ends, time.monotonic()
            status(f"worker: lag {lag}, topics quiet for {time.monotonic() - stable_since:.0f}s")
            if lag == 0 and time.monotonic() - stable_since >= IDLE_S:
                return
            time.sleep(1.0)
        raise TimeoutError(f"the worker did not catch up within {timeout_s:.0f}s (see worker.log)")
    finally:
        probe.close()


def _distinct_ids(bootstrap: str, topics: list[str]) -> dict[str, int]:
    """Distinct event ids per topic (at-least-once transport may carry a record twice)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"demo-count-{uuid.uuid4().hex}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe(topics)
    seen: dict[str, set[str]] = {t: set() for t in topics}
    idle = time.monotonic()
    while time.monotonic() - idle < 3.0:
        messages = consumer.consume(5000, timeout=0.5)
        if messages:
            idle = time.monotonic()
        for m in messages:
            if m.error() is None:
                try:
                    seen[m.topic()].add(codec.decode(m.value()).event_id)
                except codec.CodecError:
                    pass  # poison: counted through its dead letter
    consumer.close()
    return {t: len(ids) for t, ids in seen.items()}


def _run_sinks(env: dict[str, str], data: Path, timeout_s: float, status: Callable[[str], None]) -> None:
    status("sinks: writing ClickHouse and the audit log")
    sinks = [_cli("sink", kind, "--until-empty", env=env, log=data / f"sink-{kind}.log") for kind in ("clickhouse", "audit")]
    for sink in sinks:
        if sink.wait(timeout_s) != 0:
            raise RuntimeError(f"a sink exited with {sink.returncode} (see {data}/sink-*.log)")


def run(settings: Settings, requests: int, seed: int, status: Callable[[str], None] = lambda _: None, timeout_s: float = 600.0) -> dict[str, Any]:
    data = Path(settings.data_dir).resolve()
    data.mkdir(parents=True, exist_ok=True)
    prefix = settings.topic_prefix or f"demo-{uuid.uuid4().hex[:8]}."
    settings = settings.model_copy(update={"topic_prefix": prefix})
    bootstrap = settings.kafka_bootstrap
    status("creating topics")
    ensure_topics(bootstrap, prefix, settings.partitions)
    env = {**os.environ, "ENTROLOOP_KAFKA_BOOTSTRAP": bootstrap, "ENTROLOOP_TOPIC_PREFIX": prefix,
           "ENTROLOOP_DATA_DIR": str(data), "ENTROLOOP_PARTITIONS": str(settings.partitions)}
    worker = _cli("worker", env={**env, "ENTROLOOP_DATA_DIR": str(data / "worker")}, log=data / "worker.log")
    try:
        truth = FleetTruth()
        publisher = Publisher.from_settings(settings, spool_dir=data / "spool")
        raw = Producer({"bootstrap.servers": bootstrap})
        fleet = SyntheticFleet(seed=seed)
        for i, req in enumerate(fleet.requests(requests)):
            for record in req.records:
                publisher.publish(record)
            truth.observe(req)
            if i % 500 == 250:  # poison a real topic sees, from a foreign producer
                valid = next(r for r in req.records if isinstance(r, TokenEntropy))
                for _, payload in malformed_payloads(fleet.rng, codec.encode(valid)):
                    raw.produce(prefix + TokenEntropy.topic, key=valid.request_id.encode(), value=payload)
                    truth.malformed += 1
            if i % 200 == 0:
                status(f"fleet: {i}/{requests} requests published")
        raw.flush(60)
        if not publisher.flush(120):
            raise RuntimeError("the publisher could not deliver every record within 120 s")
        publisher_stats = publisher.close(timeout=5.0)
        inputs = sorted({prefix + TOPIC_BY_TYPE[t].name for p in default_processors(settings) for t in p.inputs})
        _wait_for_worker(bootstrap, inputs, prefix + STREAMS_GROUP, settings.partitions, timeout_s, status)
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(60)
        except subprocess.TimeoutExpired:
            worker.kill()
    _run_sinks(env, data, timeout_s, status)
    # The action runner after the first sink pass, so its case bundles find the alerted requests in
    # ClickHouse (chDB: one process per folder, so never beside a sink); a second pass stores its
    # Action records.
    status("actions: running the runbooks of every alert")
    actions = _cli("actions", "--until-idle", env=env, log=data / "actions.log")
    if actions.wait(timeout_s) != 0:
        raise RuntimeError(f"`entroloop actions` exited with {actions.returncode} (see {data}/actions.log)")
    _run_sinks(env, data, timeout_s, status)
    # Topics the worker writes to: the derived ones, and fallbacks, where the intent scorer adds its
    # own to the gateway's (the fleet's truth knows only the latter): count what is on the topic.
    derived = [t for t in TOPICS if not t.source or t.record_type is Fallback]
    emitted = dict(truth.emitted)
    emitted.update({t.name: n for t, n in zip(derived, _distinct_ids(bootstrap, [prefix + t.name for t in derived]).values())})
    client = connect(settings.resolved_clickhouse_dsn())
    summary = summarize(client, settings.clickhouse_database, truth, emitted, open_worm_store(settings))
    # sent / spooled / replayed / failed / dropped: where a record went missing, if one did
    summary["publisher"] = publisher_stats
    return summary
