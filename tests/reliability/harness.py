"""Shared harness of the reliability suite: real services, one fault at a time, figures in one format.

Every scenario ends in a ``Figures`` row: events sent, unique events stored per sink, duplicates
absorbed (repeats that reached a sink and were deduplicated there), lost, and the seconds from the
end of the fault until the pipeline had caught up. "Nothing lost" is checked on the identity of an
event, ``(node_id, seq)``: every pair sent must be present exactly once in each sink.

Building blocks:
- ``DedicatedBroker``: a Kafka broker of the harness's own (own ports, own data folder), started
  from the jars ``scripts/services.sh`` resolved, so stopping it never disturbs other tests that
  share the services broker.
- ``run_sink``: ``entroloop sink clickhouse|audit --until-empty --json`` as a subprocess (a sink owns
  its chDB folder: chDB opens one folder per process), optionally SIGKILLed between its durable
  write and its offset commit by the sink's fault hook.
- ``clickhouse_identities``: ``(node_id, seq) -> rows`` per table, read in a subprocess after the
  sink exited.
- ``publish_records``: the fleet's records through the real node publisher.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[2]
KAFKA_CLASSPATH = REPO_ROOT / ".services" / "kafka" / "classpath.txt"
PYTHON = sys.executable

Identity = tuple[str, int]

# Every scenario's row, printed again in the terminal summary (tests/reliability/conftest.py).
RESULTS: list[Figures] = []


@dataclass
class Figures:
    """One scenario's figures in the common format."""

    scenario: str
    sent: int
    stored: dict[str, int] = field(default_factory=dict)
    """Unique events stored, per sink (a sink can be a ClickHouse table group, the audit log, a topic)."""
    duplicates_absorbed: int = 0
    lost: int = 0
    recovery_s: float | None = None
    note: str = ""

    def line(self) -> str:
        stored = ", ".join(f"{sink}={n}" for sink, n in self.stored.items())
        recovery = "n/a" if self.recovery_s is None else f"{self.recovery_s:.1f}"
        text = (f"[reliability] {self.scenario}: sent={self.sent} unique stored per sink: {stored} | "
                f"duplicates absorbed={self.duplicates_absorbed} lost={self.lost} recovery_s={recovery}")
        return text + (f" ({self.note})" if self.note else "")


def report(figures: Figures) -> Figures:
    """Print a scenario's figures and keep them for the summary (and REPORT_FILE, when set)."""
    print("\n" + figures.line(), flush=True)
    RESULTS.append(figures)
    target = os.environ.get("ENTROLOOP_RELIABILITY_REPORT")
    if target:
        with open(target, "a") as f:
            f.write(json.dumps(asdict(figures)) + "\n")
    return figures


def check_exactly_once(sent: Iterable[Identity], stored: Counter[Identity], sink: str) -> tuple[int, int, int]:
    """(unique stored, stored twice or more, lost) of the ``sent`` identities in one sink."""
    sent_set = set(sent)
    lost = len(sent_set - set(stored))
    twice = sum(1 for key in sent_set if stored.get(key, 0) > 1)
    unique = len(sent_set & set(stored))
    extra = set(stored) - sent_set
    assert not extra, f"{sink}: {len(extra)} stored identities were never sent, e.g. {sorted(extra)[:3]}"
    return unique, twice, lost


# --- services -------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def port_open(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5):
            return True
    except OSError:
        return False


def kraft_cluster_id() -> str:
    """A random KRaft cluster id as StorageTool takes it.

    Kafka's own Uuid.randomUuid() rerolls ids whose base64 form starts with '-': the tool's
    argument parser would read such an id as an option (a CI run failed that way, 1 in 64).
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cluster_id.startswith("-"):
            return cluster_id


class DedicatedBroker:
    """A single-node KRaft broker that belongs to one test; stop() and start() keep its data."""

    def __init__(self, folder: Path) -> None:
        if not KAFKA_CLASSPATH.is_file():
            raise RuntimeError(f"{KAFKA_CLASSPATH} is missing: run `bash scripts/services.sh up kafka` once "
                               "(it resolves the broker jars from Maven Central)")
        self.folder = folder
        self.folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.controller_port = free_port()
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.classpath = KAFKA_CLASSPATH.read_text().strip()
        self.process: subprocess.Popen[bytes] | None = None
        self._write_config()
        self._format()

    def _write_config(self) -> None:
        (self.folder / "server.properties").write_text(
            "process.roles=broker,controller\nnode.id=1\n"
            f"controller.quorum.voters=1@127.0.0.1:{self.controller_port}\n"
            f"listeners=PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}\n"
            f"advertised.listeners=PLAINTEXT://127.0.0.1:{self.port}\n"
            "controller.listener.names=CONTROLLER\ninter.broker.listener.name=PLAINTEXT\n"
            "listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT\n"
            f"log.dirs={self.folder / 'data'}\nnum.partitions=3\nauto.create.topics.enable=true\n"
            "default.replication.factor=1\nmin.insync.replicas=1\noffsets.topic.replication.factor=1\n"
            "offsets.topic.num.partitions=3\ntransaction.state.log.replication.factor=1\n"
            "transaction.state.log.min.isr=1\nshare.coordinator.state.topic.replication.factor=1\n"
            "share.coordinator.state.topic.min.isr=1\ngroup.initial.rebalance.delay.ms=0\n"
        )
        (self.folder / "log4j2.properties").write_text(
            "status = warn\nappender.file.type = File\nappender.file.name = file\n"
            f"appender.file.fileName = {self.folder / 'server.log'}\nappender.file.layout.type = PatternLayout\n"
            "appender.file.layout.pattern = [%d] %p %m (%c)%n\nrootLogger.level = INFO\n"
            "rootLogger.appenderRef.file.ref = file\n"
        )

    def _java(self, *args: str) -> list[str]:
        return ["java", "-Xms128m", "-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
                f"-Dlog4j2.configurationFile={self.folder / 'log4j2.properties'}", "-cp", self.classpath, *args]

    def _format(self) -> None:
        cluster_id = kraft_cluster_id()
        formatted = subprocess.run(self._java("kafka.tools.StorageTool", "format", "-t", cluster_id, "-c",
                                              str(self.folder / "server.properties")),
                                   capture_output=True, timeout=120)
        if formatted.returncode != 0:
            raise RuntimeError(f"kafka StorageTool format failed ({formatted.returncode}): "
                               f"{formatted.stdout.decode(errors='replace')}{formatted.stderr.decode(errors='replace')}")

    def start(self, timeout: float = 120.0) -> float:
        """Start the broker; return the seconds until it accepted a metadata request."""
        started = time.monotonic()
        log = open(self.folder / "stdout.log", "ab")
        self.process = subprocess.Popen(self._java("kafka.Kafka", str(self.folder / "server.properties")),
                                        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        deadline = started + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"broker exited with {self.process.returncode}; see {self.folder}/server.log")
            if port_open(self.port):
                try:
                    AdminClient({"bootstrap.servers": self.bootstrap}).list_topics(timeout=2)
                    return time.monotonic() - started
                except KafkaException:
                    pass
            time.sleep(0.2)
        raise RuntimeError(f"broker not ready after {timeout}s; see {self.folder}/server.log")

    def stop(self, kill: bool = False) -> None:
        """SIGTERM (or SIGKILL) the broker and wait for it to be gone."""
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=10)


# --- sinks ----------------------------------------------------------------------------------------
def sink_env(bootstrap: str, prefix: str, data_dir: Path, partitions: int, **extra: str) -> dict[str, str]:
    env = {
        **os.environ,
        "ENTROLOOP_KAFKA_BOOTSTRAP": bootstrap,
        "ENTROLOOP_TOPIC_PREFIX": prefix,
        "ENTROLOOP_PARTITIONS": str(partitions),
        "ENTROLOOP_DATA_DIR": str(data_dir),
        "ENTROLOOP_CLICKHOUSE_DSN": f"chdb://{data_dir / 'clickhouse'}",
        "ENTROLOOP_AUDIT_STORE": "local",
    }
    env.pop("ENTROLOOP_FAULT_KILL_AFTER_WRITE", None)
    env.update(extra)
    return env


def run_sink(kind: str, env: dict[str, str], *options: str, fault_after: int = 0,
             timeout: float = 180) -> tuple[int, dict[str, Any], str]:
    """Run `entroloop sink KIND --until-empty --json`; return (exit code, final counters, stderr)."""
    env = dict(env)
    if fault_after:
        env["ENTROLOOP_FAULT_KILL_AFTER_WRITE"] = str(fault_after)
    proc = subprocess.run(
        [PYTHON, "-m", "entroloop.cli", "sink", kind, "--until-empty", "--json", "--session-timeout-s", "6", *options],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=timeout,
    )
    stats: dict[str, Any] = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            stats = json.loads(line)
    return proc.returncode, stats, proc.stderr


_IDENTITY_QUERY = r"""
import json, sys
from entroloop.infra.clickhouse.client import connect
from entroloop.contract.topics import TOPICS
c = connect(sys.argv[1])
existing = {r[0] for r in c.query("SELECT name FROM system.tables WHERE database = 'entroloop'").result_rows}
out = {}
for t in TOPICS:
    if t.table not in existing:
        continue
    rows = c.query(f"SELECT node_id, seq, count() FROM entroloop.{t.table} GROUP BY node_id, seq").result_rows
    out[t.table] = [[n, int(s), int(k)] for n, s, k in rows]
extra = sys.argv[2] if len(sys.argv) > 2 else ""
result = {"tables": out}
if extra:
    result["query"] = [list(map(str, r)) for r in c.query(extra).result_rows]
print(json.dumps(result))
"""


def clickhouse_query(data_dir: Path, sql: str = "") -> dict[str, Any]:
    """Read a sink's chDB folder in a subprocess (it owns that folder; this process may own another)."""
    done = subprocess.run([PYTHON, "-c", _IDENTITY_QUERY, f"chdb://{data_dir / 'clickhouse'}", sql],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# Deletes the newest insert's rows from its raw table, not from the deduplication log nor from the
# rollups: what a SIGKILL of chDB's process between ClickHouse's log append and its part rename
# leaves behind (``entroloop.sinks.clickhouse.torn_insert``).
_TEAR = r"""
import json, sys
from entroloop.infra.clickhouse.client import connect
from entroloop.sinks.clickhouse.torn_insert import newest_insert
from entroloop.sinks.clickhouse.writer import EVENT_TABLES
client, db = connect(sys.argv[1]), "entroloop"
table, token = newest_insert(client, db, EVENT_TABLES)
rows = client.query(f"SELECT count() FROM {db}.{table} WHERE insert_token = '{token}'").result_rows[0][0]
client.command(f"ALTER TABLE {db}.{table} DELETE WHERE insert_token = '{token}' SETTINGS mutations_sync = 2")
print(json.dumps({"table": table, "token": token, "rows": rows}))
"""


def tear_newest_insert(data_dir: Path) -> dict[str, Any]:
    """Make the newest insert of the chDB folder under ``data_dir`` torn; its table, token and rows."""
    done = subprocess.run([PYTHON, "-c", _TEAR, f"chdb://{(data_dir / 'clickhouse').resolve()}"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=180, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    torn = json.loads(done.stdout.strip().splitlines()[-1])
    assert torn["rows"] > 0, torn
    return torn


def clickhouse_identities(data_dir: Path) -> dict[str, Counter[Identity]]:
    """``(node_id, seq) -> rows`` per table (raw rows, no FINAL: a stored duplicate shows as 2)."""
    tables = clickhouse_query(data_dir)["tables"]
    return {table: Counter({(n, s): k for n, s, k in rows}) for table, rows in tables.items()}


def all_identities(per_table: dict[str, Counter[Identity]], tables: Iterable[str] | None = None) -> Counter[Identity]:
    total: Counter[Identity] = Counter()
    for table, counts in per_table.items():
        if tables is None or table in tables:
            total.update(counts)
    return total


# --- fleet ----------------------------------------------------------------------------------------
def fleet_records(requests: int, seed: int) -> list[Any]:
    from entroloop.collectors.synthetic_fleet import SyntheticFleet

    return [r for request in SyntheticFleet(seed=seed).requests(requests) for r in request.records]


def identity(record: Any) -> Identity:
    return (record.node_id, int(record.seq))


def wait_for(condition, timeout: float, interval: float = 0.1, what: str = "condition") -> float:
    """Poll until ``condition()`` is true; return the seconds it took."""
    started = time.monotonic()
    while not condition():
        if time.monotonic() - started > timeout:
            raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)
    return time.monotonic() - started


# --- audit log ------------------------------------------------------------------------------------
def audit_identities(store: Any) -> Counter[Identity]:
    """``(node_id, seq) -> rows`` over every audit Parquet file of a write-once store."""
    import io

    import pyarrow.parquet as pq

    counts: Counter[Identity] = Counter()
    for key in store.list("audit/"):
        if not key.endswith(".parquet"):
            continue
        table = pq.read_table(io.BytesIO(store.get(key)), columns=["node_id", "seq"])
        counts.update(zip(table.column("node_id").to_pylist(), (int(s) for s in table.column("seq").to_pylist())))
    return counts


def topic_messages(bootstrap: str, prefix: str) -> int:
    """Messages in every topic under ``prefix`` (high minus low watermark): the copies Kafka holds."""
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"count-{uuid.uuid4().hex}"})
    try:
        total = 0
        for name, meta in consumer.list_topics(timeout=10).topics.items():
            if not name.startswith(prefix):
                continue
            for partition in meta.partitions:
                low, high = consumer.get_watermark_offsets(TopicPartition(name, partition), timeout=10)
                total += high - low
        return total
    finally:
        consumer.close()
