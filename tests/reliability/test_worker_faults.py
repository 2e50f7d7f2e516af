"""Faults of the stream worker (`entroloop worker`, Faust): SIGKILLed mid-stream three times in a row,
and a rebalance while events flow (a second worker joins, then leaves).

The worker's output is checked against the alerts the entropy detector gives in-process for the
same traffic (derived records have deterministic ids, node and seq: ``entroloop.streams.base.derive``), in two
sinks: the alerts topic (at-least-once: a restart republishes, counted as duplicates) and ClickHouse
after `entroloop sink clickhouse` drained the prefix (read with FINAL: what a query sees; the
ReplacingMergeTree absorbs the repeats by event id).

Building blocks come from tests/integration/test_fleet_worker_kafka.py (publish_fleet, start_worker,
AlertReader), imported as a module so its tests are not collected twice.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from entroloop.streams.entropy_anomaly import GIBBERISH, LOOP

import tests.integration.test_fleet_worker_kafka as fleet_worker
from entroloop.contract.records import Alert
from tests.reliability.harness import (
    PYTHON,
    REPO_ROOT,
    Figures,
    check_exactly_once,
    clickhouse_query,
    identity,
    report,
    run_sink,
    sink_env,
)


def expected_alerts(bootstrap: str, prefix: str) -> dict[str, tuple[str, int]]:
    """event_id -> (node_id, seq) of the alerts the detector gives in-process for the published tokens."""
    return {a.event_id: identity(a) for a in fleet_worker.published_entropy_alerts(bootstrap, prefix)}


def alerts_in_clickhouse(bootstrap: str, prefix: str, data_dir: Path):
    """Drain the prefix into chDB with the real sink; (node_id, seq) -> rows of entropy alerts (FINAL)."""
    from collections import Counter

    code, _, err = run_sink("clickhouse", sink_env(bootstrap, prefix, data_dir, 6))
    assert code == 0, err[-3000:]
    rows = clickhouse_query(data_dir, "SELECT node_id, seq, count() FROM entroloop.alerts FINAL "
                                      f"WHERE rule IN ('{LOOP}', '{GIBBERISH}') GROUP BY node_id, seq")["query"]
    raw = clickhouse_query(data_dir, f"SELECT count() FROM entroloop.alerts WHERE rule IN ('{LOOP}', '{GIBBERISH}')")
    return Counter({(n, int(s)): int(k) for n, s, k in rows}), int(raw["query"][0][0])


def finish(scenario: str, expected: dict[str, tuple[str, int]], reader, recovery_s: float, bootstrap: str,
           prefix: str, tmp_path: Path, note: str) -> None:
    topic_copies = sum(reader.ids.values())
    topic_lost = len(set(expected) - set(reader.ids))
    stored, raw_rows = alerts_in_clickhouse(bootstrap, prefix, tmp_path / "sink")
    unique, twice, ch_lost = check_exactly_once(expected.values(), stored, "clickhouse alerts")
    report(Figures(
        scenario,
        sent=len(expected),
        stored={"alerts topic": len(set(reader.ids) & set(expected)), "clickhouse": unique},
        duplicates_absorbed=topic_copies - len(reader.ids),
        lost=topic_lost + ch_lost,
        recovery_s=recovery_s,
        note=f"sent = alerts expected from the in-process detector; clickhouse raw rows {raw_rows}, FINAL {unique}; "
        + note,
    ))
    assert topic_lost == 0 and ch_lost == 0
    assert set(reader.ids) == set(expected), "the worker published alerts the detector would not"
    assert twice == 0


def test_worker_sigkilled_three_times_mid_stream(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    # 3,000 requests and a worker killed within ~50 ms of its first new alert: the stream outlasts the kills
    fleet_worker.publish_fleet(kafka_bootstrap, topic_prefix, 3000, 5, tmp_path / "spool")
    expected = expected_alerts(kafka_bootstrap, topic_prefix)
    reader = fleet_worker.AlertReader(kafka_bootstrap, topic_prefix + Alert.topic)
    kills_at: list[int] = []
    worker: subprocess.Popen | None = None
    try:
        for kill in range(3):
            if set(expected) <= set(reader.ids):
                # A fast worker can publish every alert before its kill lands: then there is no stream
                # left to kill in the middle of (a new worker could only republish), and asking it for
                # progress would fail on the test's timing, not on the worker.
                break
            worker, log_path = fleet_worker.start_worker(kafka_bootstrap, topic_prefix, tmp_path)
            before = len(reader.ids)
            deadline = time.monotonic() + 120
            while len(reader.ids) <= before and time.monotonic() < deadline and worker.poll() is None:
                reader.read(0.05)
            assert len(reader.ids) > before, f"kill {kill}: worker made no progress:\n{log_path.read_text()[-3000:]}"
            kills_at.append(len(reader.ids))
            worker.send_signal(signal.SIGKILL)
            worker.wait(timeout=30)
        restarted = time.monotonic()
        worker, log_path = fleet_worker.start_worker(kafka_bootstrap, topic_prefix, tmp_path)
        complete = reader.read_until_complete(set(expected), timeout=180, worker=worker)
        recovery_s = time.monotonic() - restarted
        reader.read(2.0)
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    finally:
        reader.consumer.close()
        if worker is not None and worker.poll() is None:  # a failed assertion must not leave a worker running
            worker.kill()
            worker.wait(timeout=30)
    assert complete, fleet_worker.missing_alerts_report(kafka_bootstrap, topic_prefix,
                                                        set(expected) - set(reader.ids), log_path)
    assert kills_at[0] < len(expected), "the first kill should come before the worker finished"
    finish("worker SIGKILLed 3x mid-stream", expected, reader, recovery_s, kafka_bootstrap, topic_prefix, tmp_path,
           f"{len(kills_at)} kills, alerts seen at each: {kills_at}; recovery = last restart to every alert published")


def test_rebalance_second_worker_joins_then_leaves(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    requests, seconds = 2400, 24
    fleet = subprocess.Popen(
        [PYTHON, "-m", "entroloop.cli", "fleet", "-b", kafka_bootstrap, "--topic-prefix", topic_prefix, "-n",
         str(requests), "--seed", "9", "--rate", str(requests / seconds), "--spool-dir", str(tmp_path / "spool")],
        cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    reader = fleet_worker.AlertReader(kafka_bootstrap, topic_prefix + Alert.topic)
    first, first_log = fleet_worker.start_worker(kafka_bootstrap, topic_prefix, tmp_path)
    try:
        deadline = time.monotonic() + 120
        while not reader.ids and time.monotonic() < deadline and first.poll() is None:
            reader.read(0.3)
        assert reader.ids, f"the first worker made no progress:\n{first_log.read_text()[-3000:]}"
        second, second_log = fleet_worker.start_worker(kafka_bootstrap, topic_prefix, tmp_path)
        joined_at = len(reader.ids)
        deadline = time.monotonic() + 90  # it has joined once it owns partitions
        while "Worker ready" not in second_log.read_text() and time.monotonic() < deadline and second.poll() is None:
            reader.read(0.5)
        assert "Worker ready" in second_log.read_text(), second_log.read_text()[-3000:]
        reader.read(8.0)  # both workers share the partitions for a while
        assert second.poll() is None, second_log.read_text()[-3000:]
        second.send_signal(signal.SIGTERM)  # it leaves: its partitions go back to the first
        left = time.monotonic()
        second.wait(timeout=60)
        fleet_out, _ = fleet.communicate(timeout=180)
        assert fleet.returncode == 0 and "dropped=0" in fleet_out, fleet_out
        expected = expected_alerts(kafka_bootstrap, topic_prefix)
        complete = reader.read_until_complete(set(expected), timeout=180, worker=first)
        recovery_s = time.monotonic() - left
        reader.read(2.0)
    finally:
        for proc in (first, fleet):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=60)
        reader.consumer.close()
    assert complete, (fleet_worker.missing_alerts_report(kafka_bootstrap, topic_prefix,
                                                         set(expected) - set(reader.ids), first_log)
                      + "\nsecond worker:\n" + second_log.read_text()[-3000:])
    second_text = second_log.read_text()
    finish("rebalance: a second worker joins, then leaves", expected, reader, recovery_s, kafka_bootstrap,
           topic_prefix, tmp_path, f"alerts seen when the second joined: {joined_at}; recovery = second left to "
           f"every alert published (fleet still publishing for part of it)"
           + ("" if "Traceback" not in second_text else "; second worker log has a traceback"))
