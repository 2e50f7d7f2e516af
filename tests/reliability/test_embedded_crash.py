"""Crash consistency of the embedded mode: ``entroloop demo`` SIGKILLed anywhere, then ``entroloop replay``.

The embedded runner keeps the bus in files, its offsets and batch cuts in JSON files, and stores into
chDB and the write-once audit log. After a SIGKILL at any instruction plus one ``replay``:

- every ClickHouse table holds exactly the records of its topic on the bus (by event id, ``FINAL``),
  and the audit log holds every audit record on the bus;
- every record the fleet produced is stored, once the drain had started (what the fleet had only
  buffered when it was killed never reached the bus; a killed producer loses its unsent records);
- every per-minute rollup equals the same aggregate computed from its raw table: a record re-read
  after the crash (or by the replay) is never counted twice;
- a second replay changes nothing, table or rollup.

The kills come from the runner's fault hook (``ENTROLOOP_FAULT_KILL_EMBEDDED=POINT:N``) at each of
its points, and from a plain SIGKILL at seeded random moments. Small batches
(``ENTROLOOP_AUDIT_BATCH_RECORDS``) give many batches, cut points and drain steps per partition.

Before the fix the same scenarios lost the derived records of committed batches (appends were not
flushed before offsets were saved) and a clean replay inflated ``anomalies_1m`` (derived batches
cut differently on replay slipped past insert deduplication into the sum-rollups).

This file also runs as the probe that reads one data folder (``python -c PROBE DIR``): chDB opens
one folder per process, so each folder is read in a process of its own.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from tests.reliability.harness import REPO_ROOT, Figures, report, tear_newest_insert

REQUESTS = 300  # per crash scenario: small batches give many cuts and steps in a short run
SEED = 11
BATCH = 40
CLEAN_REQUESTS = 2000  # the demo's default size and batch: where a clean replay used to inflate rollups
PYTHON = sys.executable

# Each rollup total beside the same aggregate over its raw table (FINAL: one row per event id).
ROLLUP_CHECKS = {
    "entropy_1m.chunks": ("SELECT sum(chunks) FROM {db}.entropy_1m", "SELECT count() FROM {db}.token_entropy FINAL"),
    "entropy_1m.tokens": ("SELECT sum(tokens) FROM {db}.entropy_1m",
                          "SELECT sum(length(entropies)) FROM {db}.token_entropy FINAL"),
    "entropy_1m.requests": ("SELECT sum(requests) FROM {db}.entropy_1m",
                            "SELECT countIf(final) FROM {db}.token_entropy FINAL"),
    "latency_1m.spans": ("SELECT sum(spans) FROM {db}.latency_1m", "SELECT count() FROM {db}.spans FINAL"),
    "latency_1m.errors": ("SELECT sum(errors) FROM {db}.latency_1m",
                          "SELECT countIf(status != 'ok') FROM {db}.spans FINAL"),
    "similarity_1m.scores": ("SELECT sum(scores) FROM {db}.similarity_1m", "SELECT count() FROM {db}.intent_scores FINAL"),
    "anomalies_1m.alerts": ("SELECT sum(alerts) FROM {db}.anomalies_1m", "SELECT count() FROM {db}.alerts FINAL"),
    "fallbacks_1m.fallbacks": ("SELECT sum(fallbacks) FROM {db}.fallbacks_1m", "SELECT count() FROM {db}.fallbacks FINAL"),
    "bad_cases_1m.bad_cases": ("SELECT sum(bad_cases) FROM {db}.bad_cases_1m", "SELECT count() FROM {db}.bad_cases FINAL"),
    "requests_1m.requests": ("SELECT sum(requests) FROM {db}.requests_1m", "SELECT count() FROM {db}.audit_index FINAL"),
    "requests_1m.prompt_chars": ("SELECT sum(prompt_chars) FROM {db}.requests_1m",
                                 "SELECT sum(prompt_chars) FROM {db}.audit_index FINAL"),
    "feedback_1m.feedback": ("SELECT sum(feedback) FROM {db}.feedback_1m", "SELECT count() FROM {db}.feedback FINAL"),
    "feedback_1m.corrections": ("SELECT sum(corrections) FROM {db}.feedback_1m",
                                "SELECT countIf(has_correction) FROM {db}.feedback FINAL"),
}

PROBE = r"""
import io, json, sys
from pathlib import Path
import pyarrow.parquet as pq
from entroloop.contract.codec import CodecError, decode
from entroloop.contract.settings import load_settings
from entroloop.contract.topics import TOPICS
from entroloop.infra.bus import LocalLog
from entroloop.infra.clickhouse.client import connect
from entroloop.infra.worm.stores import open_worm_store

settings = load_settings(data_dir=Path(sys.argv[1]))
checks = json.loads(sys.argv[2])
db = settings.clickhouse_database
try:  # decode as the runner does: records outside the configured event-time window are dead letters
    from entroloop.contract.codec import EventTimeWindow
    window = (EventTimeWindow.from_settings(settings),)
except ImportError:
    window = ()
log = LocalLog(Path(settings.data_dir) / "log", settings.partitions)
bus = {}
for t in TOPICS:
    ids = bus[t.name] = []
    for p in range(settings.partitions):
        for _key, value in log.read(t.name, p, 0, log.end_offset(t.name, p)):
            try:
                record = decode(value, settings.max_record_bytes, *window)
            except CodecError:
                continue  # dead-lettered: it is on the dead-letter topic under its own id
            if isinstance(record, t.record_type):
                ids.append(record.event_id)
log.close()
client = connect(settings.resolved_clickhouse_dsn())
q = lambda sql: client.query(sql).result_rows
tables = {
    t.name: [[str(e), n, int(s)] for e, n, s in q(f"SELECT toString(event_id), node_id, seq FROM {db}.{t.table} FINAL")]
    for t in TOPICS
}
rollups = {name: [float(q(a.format(db=db))[0][0] or 0), float(q(b.format(db=db))[0][0] or 0)]
           for name, (a, b) in checks.items()}
store = open_worm_store(settings)
audit_log = []
for key in store.list("audit/"):
    if key.endswith(".parquet"):
        audit_log += [str(v) for v in pq.read_table(io.BytesIO(store.get(key)), columns=["event_id"]).column("event_id").to_pylist()]
print(json.dumps({"bus": bus, "tables": tables, "rollups": rollups, "audit_log": audit_log}))
"""


def _env(data_dir: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENTROLOOP_")}
    env.update(ENTROLOOP_DATA_DIR=str(data_dir), **extra)
    return env


def _start_demo(data_dir: Path, requests: int = REQUESTS, batch: int | None = BATCH, **extra: str) -> subprocess.Popen[str]:
    if batch:
        extra["ENTROLOOP_AUDIT_BATCH_RECORDS"] = str(batch)
    # cwd outside the repo: the runner imports what the environment (or PYTHONPATH) provides
    return subprocess.Popen(
        [PYTHON, "-m", "entroloop.cli", "demo", "--requests", str(requests), "--seed", str(SEED), "--json"],
        cwd=data_dir.parent, env=_env(data_dir, **extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def _replay(data_dir: Path) -> dict[str, Any]:
    done = subprocess.run([PYTHON, "-m", "entroloop.cli", "replay", "--json"], cwd=data_dir.parent,
                          env=_env(data_dir), capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _probe(data_dir: Path) -> dict[str, Any]:
    done = subprocess.run([PYTHON, "-c", PROBE, str(data_dir), json.dumps(ROLLUP_CHECKS)], cwd=REPO_ROOT,
                          env=_env(data_dir), capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _check_consistent(state: dict[str, Any], drain_started: bool, scenario: str, requests: int = REQUESTS) -> Figures:
    """Tables equal the bus, the audit log holds the bus's audits, rollups equal raw aggregates."""
    problems: list[str] = []
    for topic, on_bus in state["bus"].items():
        bus_ids, stored = set(on_bus), [row[0] for row in state["tables"][topic]]
        assert len(bus_ids) == len(on_bus), f"{topic}: an event id is on the bus twice"
        if len(stored) != len(set(stored)):
            problems.append(f"{topic}: {len(stored) - len(set(stored))} event ids stored twice after FINAL")
        if set(stored) != bus_ids:
            problems.append(f"{topic}: {len(bus_ids - set(stored))} on the bus but not stored, "
                            f"{len(set(stored) - bus_ids)} stored but not on the bus")
    audit_topic = next(t for t in state["bus"] if ".audit." in t)
    if set(state["audit_log"]) != set(state["bus"][audit_topic]):
        problems.append(f"audit log: {len(set(state['bus'][audit_topic]) - set(state['audit_log']))} audits on the bus "
                        f"missing, {len(set(state['audit_log']) - set(state['bus'][audit_topic]))} not on the bus")
    for name, (rollup, raw) in state["rollups"].items():
        if abs(rollup - raw) > 1e-6 * max(1.0, abs(raw)):
            problems.append(f"{name}: rollup {rollup:g} vs raw table {raw:g}")
    lost = 0
    if drain_started:  # the fleet's records were all appended, and flushed by the first drain step
        stored_identities = {(topic, n, s) for topic, rows in state["tables"].items() for _, n, s in rows}
        missing = Counter(r.topic for r in _demo_fleet_records(requests)
                          if (r.topic, r.node_id, int(r.seq)) not in stored_identities)
        lost = sum(missing.values())
        if lost:
            problems.append(f"fleet records lost: {dict(missing)}")
    figures = report(Figures(
        scenario=scenario,
        sent=sum(len(v) for v in state["bus"].values()),
        stored={"clickhouse": sum(len(v) for v in state["tables"].values()), "audit_log": len(state["audit_log"])},
        lost=lost,
        note="; ".join(problems) or "tables = bus, rollups = raw aggregates",
    ))
    assert not problems, f"{scenario}:\n  " + "\n  ".join(problems)
    return figures


def _demo_fleet_records(requests: int) -> list[Any]:
    """The records ``entroloop demo --requests N --seed SEED`` publishes, made the same way.

    The demo mixes malformed payloads into the stream every 500 requests from request 250, drawing
    them from the fleet's generator, so the requests after that differ from a plain fleet's.
    """
    from entroloop.collectors.synthetic_fleet import SyntheticFleet, malformed_payloads

    from entroloop.contract.codec import encode
    from entroloop.contract.records import TokenEntropy

    fleet, records = SyntheticFleet(seed=SEED), []
    for i, request in enumerate(fleet.requests(requests)):
        records += request.records
        if i % 500 == 250:
            valid = next(r for r in request.records if isinstance(r, TokenEntropy))
            list(malformed_payloads(fleet.rng, encode(valid)))
    return records


def _state_without_bus(state: dict[str, Any]) -> dict[str, Any]:
    return {"tables": {t: sorted(map(tuple, rows)) for t, rows in state["tables"].items()},
            "rollups": state["rollups"], "audit_log": sorted(state["audit_log"])}


def _drain_started(data_dir: Path) -> bool:
    """The runner journals its first batch cuts right after the first flush of the log."""
    return (data_dir / "batch_cuts.json").exists()


def _replay_and_check(data_dir: Path, scenario: str, drain_started: bool) -> dict[str, Any]:
    """Replay, check, replay again and check nothing changed; the first replay's result."""
    first = _replay(data_dir)
    state = _probe(data_dir)
    _check_consistent(state, drain_started, scenario)
    again = _replay(data_dir)
    assert again["unchanged"], f"{scenario}: a second replay changed the tables: {again}"
    assert _state_without_bus(_probe(data_dir)) == _state_without_bus(state), (
        f"{scenario}: a second replay changed a table or a rollup")
    assert again["torn_inserts_repaired"] == {"rows": 0, "rollups": 0}, again
    return first


def test_clean_replay_leaves_every_table_and_rollup_unchanged(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    demo = _start_demo(data_dir, CLEAN_REQUESTS, batch=None)
    _, err = demo.communicate(timeout=600)
    assert demo.returncode == 0, err[-3000:]
    before = _probe(data_dir)
    _check_consistent(before, True, "embedded demo, finished", CLEAN_REQUESTS)
    result = _replay(data_dir)
    assert result["unchanged"] and result["audit_files_rewritten"] == 0, result
    after = _probe(data_dir)
    _check_consistent(after, True, "embedded demo, finished, then replayed", CLEAN_REQUESTS)
    assert _state_without_bus(after) == _state_without_bus(before)


@pytest.mark.parametrize(("point", "nth"), [("insert", 7), ("batch", 60), ("flushed", 2), ("committed", 3)])
def test_sigkill_at_a_fault_point_then_replay(tmp_path: Path, point: str, nth: int) -> None:
    data_dir = tmp_path / "data"
    demo = _start_demo(data_dir, ENTROLOOP_FAULT_KILL_EMBEDDED=f"{point}:{nth}")
    _, err = demo.communicate(timeout=600)
    assert demo.returncode == -signal.SIGKILL, f"the fault hook should have killed the demo (exit {demo.returncode}):\n{err[-2000:]}"
    assert f"fault: SIGKILL at {point} #{nth}" in err
    _replay_and_check(data_dir, f"embedded demo SIGKILLed at {point} #{nth}, then replayed", _drain_started(data_dir))


def test_insert_torn_inside_clickhouse_then_replay(tmp_path: Path) -> None:
    """The random kill CI once caught: between ClickHouse's deduplication log and its part rename.

    The replay of that batch is dropped by the token the log kept; the runner restores the rows
    the raw table lacks without counting them in the rollups again (tests/integration/test_torn_insert.py
    makes every torn state on disk; this one goes through the demo and ``entroloop replay``).
    """
    data_dir = tmp_path / "data"
    demo = _start_demo(data_dir, ENTROLOOP_FAULT_KILL_EMBEDDED="insert:7")
    _, err = demo.communicate(timeout=600)
    assert demo.returncode == -signal.SIGKILL, err[-2000:]
    tear = tear_newest_insert(data_dir)
    replayed = _replay_and_check(data_dir, f"embedded demo SIGKILLed inside ClickHouse's commit of {tear['token']} "
                                 f"({tear['rows']} rows), then replayed", drain_started=True)
    assert replayed["torn_inserts_repaired"] == {"rows": tear["rows"], "rollups": 0}, replayed


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_sigkill_at_a_random_moment_then_replay(tmp_path: Path, seed: int) -> None:
    """A plain SIGKILL: seed 1 while the fleet publishes (or early in the drain), the others in the drain."""
    rng = random.Random(seed)
    data_dir = tmp_path / "data"
    demo = _start_demo(data_dir)

    def got_that_far() -> bool:
        if demo.poll() is not None:
            return True
        if seed == 1:  # the fleet's first append creates the first log file
            return any((data_dir / "log").glob("*/*.log"))
        return (data_dir / "offsets.json").exists() or _drain_started(data_dir)

    deadline = time.monotonic() + 120
    while not got_that_far():
        assert time.monotonic() < deadline, "the demo never got that far"
        time.sleep(0.005)
    time.sleep(rng.uniform(0.0, 0.3) if seed == 1 else rng.uniform(0.0, 0.6))
    demo.send_signal(signal.SIGKILL)
    demo.communicate(timeout=60)
    killed = demo.returncode == -signal.SIGKILL
    _replay_and_check(data_dir, f"embedded demo SIGKILLed at a random moment (seed {seed}, "
                      f"{'killed' if killed else 'had finished'}), then replayed", _drain_started(data_dir))


def test_sigkill_during_a_replay_then_replay_again(tmp_path: Path) -> None:
    """A replay is a drain too: killed half-way, the next replay still stores nothing twice."""
    data_dir = tmp_path / "data"
    demo = _start_demo(data_dir)
    _, err = demo.communicate(timeout=600)
    assert demo.returncode == 0, err[-3000:]
    killed = subprocess.run([PYTHON, "-m", "entroloop.cli", "replay", "--json"], cwd=tmp_path, capture_output=True,
                            text=True, timeout=300, check=False,
                            env=_env(data_dir, ENTROLOOP_FAULT_KILL_EMBEDDED="insert:25",
                                     ENTROLOOP_AUDIT_BATCH_RECORDS=str(BATCH)))
    assert killed.returncode == -signal.SIGKILL, f"the fault hook should have killed the replay:\n{killed.stderr[-2000:]}"
    _replay_and_check(data_dir, "embedded replay SIGKILLed at insert #25, then replayed", drain_started=True)
