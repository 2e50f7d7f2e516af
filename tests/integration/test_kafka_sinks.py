"""Real broker -> `entroloop sink clickhouse` / `entroloop sink audit` (subprocesses) -> storage.

Each test publishes a synthetic fleet's records (plus a few poison messages) under its own topic
prefix, runs the sinks as separate processes (each owns its chDB folder or audit folder; chDB
opens one folder per process) and checks, per topic, unique rows == events sent, with nothing
stored twice. The fault tests SIGKILL a sink right after a durable write and before its offset
commit (``ENTROLOOP_FAULT_KILL_AFTER_WRITE``) and restart it with *other* batch settings, so only
the write journal (not a lucky identical cut) can make the redelivered range hit the same
deduplication token or object key. Each scenario prints sent / stored / duplicates absorbed / lost.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from entroloop.collectors.synthetic_fleet import SyntheticFleet
from entroloop.sinks.audit.verify import verify_store
from prometheus_client.parser import text_string_to_metric_families

from entroloop.contract import codec
from entroloop.contract.records import Audit, DeadLetter, TokenEntropy
from entroloop.contract.topics import TOPIC_BY_NAME, partition_for
from entroloop.infra.kafka_topics import ensure_topics
from entroloop.infra.worm.worm_store import LocalWormStore
from tests.integration.conftest import REPO_ROOT
from tests.integration.acknowledged_producer import AcknowledgedProducer

pytestmark = pytest.mark.kafka

PARTITIONS = 3
POISON = [b"\x00not msgpack", b"\xc1", b"\x92\x01"]  # garbage, a never-used byte, a bare array


def publish(bootstrap: str, prefix: str, requests: int, seed: int) -> Counter[str]:
    """Publish the fleet's records (idempotent producer, keyed by request) and some poison; count per topic."""
    ensure_topics(bootstrap, prefix, PARTITIONS)
    producer = AcknowledgedProducer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 20})
    sent: Counter[str] = Counter()
    for request in SyntheticFleet(seed=seed).requests(requests):
        for record in request.records:
            producer.produce(prefix + record.topic, key=record.request_id.encode(), value=codec.encode(record),
                             partition=partition_for(record.request_id, PARTITIONS))
            sent[record.topic] += 1
        producer.poll(0)
    for i, payload in enumerate(POISON):
        producer.produce(prefix + TokenEntropy.topic, key=f"poison-{i}".encode(), value=payload, partition=i % PARTITIONS)
    sent[DeadLetter.topic] += len(POISON)  # the sink turns each into one dead letter
    assert producer.flush(60) == 0, "the broker did not acknowledge every record"
    return sent


def run_sink(kind: str, bootstrap: str, prefix: str, data_dir: Path, *extra: str, fault_after: int = 0,
             timeout: float = 180) -> tuple[int, dict, str]:
    """Run `entroloop sink KIND --until-empty --json`; return (exit code, final counters, stderr)."""
    env = {
        **os.environ,
        "ENTROLOOP_KAFKA_BOOTSTRAP": bootstrap,
        "ENTROLOOP_TOPIC_PREFIX": prefix,
        "ENTROLOOP_PARTITIONS": str(PARTITIONS),
        "ENTROLOOP_DATA_DIR": str(data_dir),
        "ENTROLOOP_CLICKHOUSE_DSN": f"chdb://{data_dir / 'clickhouse'}",
        "ENTROLOOP_AUDIT_STORE": "local",
    }
    env.pop("ENTROLOOP_FAULT_KILL_AFTER_WRITE", None)
    if fault_after:
        env["ENTROLOOP_FAULT_KILL_AFTER_WRITE"] = str(fault_after)
    proc = subprocess.run(
        [sys.executable, "-m", "entroloop.cli", "sink", kind, "--until-empty", "--json", "--session-timeout-s", "6", *extra],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )
    stats = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            stats = json.loads(line)
    return proc.returncode, stats, proc.stderr


def clickhouse_counts(data_dir: Path) -> dict[str, tuple[int, int]]:
    """(rows without FINAL, unique event ids) per table, read in a subprocess (it owns the folder)."""
    script = (
        "import json, sys\n"
        "from entroloop.infra.clickhouse.client import connect\n"
        "from entroloop.contract.topics import TOPICS\n"
        "c = connect(sys.argv[1])\n"
        "print(json.dumps({t.table: c.query(f'SELECT count(), uniqExact(event_id) FROM entroloop.{t.table}').result_rows[0]"
        " for t in TOPICS}))\n"
    )
    out = subprocess.run([sys.executable, "-c", script, f"chdb://{data_dir / 'clickhouse'}"], cwd=REPO_ROOT,
                         capture_output=True, text=True, timeout=120, check=True)
    return {table: (int(n), int(u)) for table, (n, u) in json.loads(out.stdout.strip().splitlines()[-1]).items()}


def check_clickhouse(sent: Counter[str], data_dir: Path, absorbed: int, scenario: str) -> None:
    counts = clickhouse_counts(data_dir)
    for topic, n in sorted(sent.items()):
        rows, unique = counts[TOPIC_BY_NAME[topic].table]
        lost = n - unique
        print(f"\n[{scenario}] {topic}: sent={n} stored={rows} unique={unique} duplicates={rows - unique} lost={lost}")
        assert unique == n and rows == n, f"{topic}: sent {n}, stored {rows} rows ({unique} unique)"
    other = {t: c for t, c in counts.items() if c[0] and t not in {TOPIC_BY_NAME[x].table for x in sent}}
    assert not other, f"rows in tables nothing was sent to: {other}"
    print(f"[{scenario}] sent={sum(sent.values())} stored={sum(counts[TOPIC_BY_NAME[t].table][0] for t in sent)} "
          f"duplicates absorbed={absorbed} lost=0")


def check_audit(sent_audit: int, data_dir: Path, absorbed: int, scenario: str) -> None:
    store = LocalWormStore(data_dir / "worm")
    report = verify_store(store)
    data_files = [k for k in store.list() if k.startswith("audit/")]
    batches = [Path(k).stem for k in data_files]
    print(f"\n[{scenario}] audit: sent={sent_audit} stored={report.records} files={report.files} "
          f"duplicates absorbed={absorbed} lost={sent_audit - report.records}")
    assert report.ok, [str(p) for p in report.problems]  # no orphan (unreferenced) or changed file
    assert report.records == sent_audit
    assert report.files == len(data_files)
    # one file per (model, day, batch); a second file for the same records would show as a batch overlap
    assert len(set(zip(batches, [str(Path(k).parent) for k in data_files]))) == len(data_files)


def test_sinks_store_every_event_once(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    sent = publish(kafka_bootstrap, topic_prefix, 300, seed=21)
    started = time.monotonic()
    procs = {}
    for kind in ("clickhouse", "audit"):
        procs[kind] = run_sink(kind, kafka_bootstrap, topic_prefix, tmp_path / kind)
    elapsed = time.monotonic() - started
    for kind, (code, stats, err) in procs.items():
        assert code == 0, f"sink {kind} failed:\n{err[-3000:]}"
        print(f"\nsink {kind}: {stats}")
    ch_stats = procs["clickhouse"][1]
    assert ch_stats["dead_letters"] == len(POISON)
    assert ch_stats["replayed_rows"] == 0
    check_clickhouse(sent, tmp_path / "clickhouse", absorbed=0, scenario="clean")
    # the poison bytes are in the write-once quarantine (by dead-letter id), not in dead_letters.payload
    quarantined = LocalWormStore(tmp_path / "clickhouse" / "quarantine")
    assert sorted(quarantined.get(k) for k in quarantined.list()) == sorted(POISON)
    check_audit(sent[Audit.topic], tmp_path / "audit", absorbed=0, scenario="clean")
    print(f"both sinks, start to drained: {elapsed:.1f} s; clickhouse sink {ch_stats['rows_per_s']:.0f} rows/s")


@pytest.mark.reliability
def test_clickhouse_sink_killed_between_write_and_commit(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    sent = publish(kafka_bootstrap, topic_prefix, 300, seed=22)
    data_dir = tmp_path / "clickhouse"
    # small, clock-closed batches before the crash ...
    code, _, err = run_sink("clickhouse", kafka_bootstrap, topic_prefix, data_dir, "--batch-rows", "40",
                            "--batch-seconds", "0.2", fault_after=6)
    assert code == -9, f"the fault hook should have SIGKILLed the sink (exit {code}):\n{err[-3000:]}"
    assert "fault: SIGKILL after durable write 6" in err
    # ... large ones after it: only the journal reproduces the pre-crash cut of the pending range
    code, stats, err = run_sink("clickhouse", kafka_bootstrap, topic_prefix, data_dir, "--batch-rows", "100000",
                                "--batch-seconds", "5")
    assert code == 0, err[-3000:]
    assert stats["replayed_rows"] > 0, f"the restart should have rewritten the uncommitted range: {stats}"
    check_clickhouse(sent, data_dir, absorbed=stats["replayed_rows"], scenario="clickhouse sink SIGKILL after write")


@pytest.mark.reliability
def test_audit_sink_killed_between_write_and_commit(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    sent = publish(kafka_bootstrap, topic_prefix, 300, seed=23)
    data_dir = tmp_path / "audit"
    code, _, err = run_sink("audit", kafka_bootstrap, topic_prefix, data_dir, "--batch-rows", "30",
                            "--batch-seconds", "0.2", fault_after=3)
    assert code == -9, f"the fault hook should have SIGKILLed the sink (exit {code}):\n{err[-3000:]}"
    code, stats, err = run_sink("audit", kafka_bootstrap, topic_prefix, data_dir, "--batch-rows", "5000",
                                "--batch-seconds", "5")
    assert code == 0, err[-3000:]
    assert stats["replayed_rows"] > 0, stats
    check_audit(sent[Audit.topic], data_dir, absorbed=stats["replayed_rows"], scenario="audit sink SIGKILL after write")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_sigterm_flushes_commits_and_exits_zero(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    """Batches far from due when SIGTERM arrives are written and committed; a restart finds no journal."""
    sent = publish(kafka_bootstrap, topic_prefix, 200, seed=24)
    data_dir = tmp_path / "clickhouse"
    env = {**os.environ, "ENTROLOOP_KAFKA_BOOTSTRAP": kafka_bootstrap, "ENTROLOOP_TOPIC_PREFIX": topic_prefix,
           "ENTROLOOP_PARTITIONS": str(PARTITIONS), "ENTROLOOP_DATA_DIR": str(data_dir),
           "ENTROLOOP_CLICKHOUSE_DSN": f"chdb://{data_dir / 'clickhouse'}", "ENTROLOOP_METRICS_PORT": str(port := free_port())}
    env.pop("ENTROLOOP_FAULT_KILL_AFTER_WRITE", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "entroloop.cli", "sink", "clickhouse", "--json", "--log-level", "info",
         "--batch-rows", "100000", "--batch-seconds", "600"],
        cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 60
        assert proc.stderr is not None
        for line in proc.stderr:  # wait until the group gave it its partitions
            if "assigned" in line or time.monotonic() > deadline:
                break
        time.sleep(3)  # let it read (nothing is due for 600 s, so nothing is written yet)
        metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    stats = json.loads([line for line in out.splitlines() if line.startswith("{")][-1])
    assert stats["rows_written"] > 0 and stats["commits"] > 0, stats
    # a Prometheus scrape (ENTROLOOP_METRICS_PORT) while it held its batches saw what it had read
    read = sum(s.value for f in text_string_to_metric_families(metrics) for s in f.samples
               if s.name == "entroloop_events_in_total" and s.labels["component"] == "sink-clickhouse")
    assert 0 < read <= stats["messages"], (read, stats["messages"])
    # a restart drains the rest (if SIGTERM came early) and has no uncommitted range to replay
    code, again, err = run_sink("clickhouse", kafka_bootstrap, topic_prefix, data_dir)
    assert code == 0, err[-3000:]
    assert again["replayed_rows"] == 0, again
    check_clickhouse(sent, data_dir, absorbed=0, scenario="SIGTERM then restart")


def test_sink_reports_an_unreachable_broker(tmp_path: Path) -> None:
    env = {**os.environ, "ENTROLOOP_KAFKA_BOOTSTRAP": "127.0.0.1:1", "ENTROLOOP_DATA_DIR": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "entroloop.cli", "sink", "clickhouse", "--until-empty"],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=60)
    message = " ".join(proc.stderr.split())  # rich wraps long lines
    assert proc.returncode == 2, message
    assert "does not answer" in message and "ENTROLOOP_KAFKA_BOOTSTRAP" in message


def test_sink_without_broker_setting_says_what_to_set(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "ENTROLOOP_KAFKA_BOOTSTRAP"}
    env["ENTROLOOP_DATA_DIR"] = str(tmp_path)
    proc = subprocess.run([sys.executable, "-m", "entroloop.cli", "sink", "audit"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    message = " ".join(proc.stderr.split())
    assert proc.returncode == 2, message
    assert "ENTROLOOP_KAFKA_BOOTSTRAP" in message


def test_a_pending_batch_member_is_read_back_from_kafka_by_offsets(kafka_bootstrap: str, topic_prefix: str) -> None:
    """A batch member this sink does not hold (another sink owns that partition, or the cut left it
    out) is read again from the broker, exactly its offsets, without joining the group."""
    from entroloop.sinks.kafka_sink import KafkaSinkConsumer

    from entroloop.contract.settings import Settings

    ensure_topics(kafka_bootstrap, topic_prefix, 2)
    records = [r for q in SyntheticFleet(seed=31).requests(20) for r in q.records if isinstance(r, TokenEntropy)][:20]
    kafka_topic = topic_prefix + TokenEntropy.topic
    producer = AcknowledgedProducer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True})
    for r in records:
        producer.produce(kafka_topic, key=r.request_id.encode(), value=codec.encode(r), partition=1)
    assert producer.flush(30) == 0
    sink = KafkaSinkConsumer("readback", object(), [TokenEntropy.topic],  # type: ignore[arg-type]
                             Settings(kafka_bootstrap=kafka_bootstrap, topic_prefix=topic_prefix))
    pairs = sink._read_range(kafka_topic, 1, 5, 14)
    assert [o for o, _ in pairs] == list(range(5, 15))
    assert [r.event_id for _, r in pairs] == [r.event_id for r in records[5:15]]
    with pytest.raises(RuntimeError, match="ends before offset 40"):
        sink._read_range(kafka_topic, 1, 15, 40, timeout=20)
