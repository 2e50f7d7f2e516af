"""Emit -> queryable lag: the fleet at a fixed request rate through Kafka and the ClickHouse sink.

The serving side is the node publisher (``collectors.publisher``) in this process, publishing the
synthetic fleet's traffic at ``rate`` requests/s for ``seconds``. The fleet generator itself runs
at ~600 requests/s on one core, so a sample of requests is generated before the clock starts and
replayed with fresh event ids and seqs; ``emitted_at`` is stamped at the moment of ``publish()``
(the emit). The sink is a real `entroloop sink clickhouse` process with its own chDB folder. Each
table has ``inserted_at DEFAULT now64(3)``, set when the row is inserted, i.e. when it becomes
queryable; per event, lag = inserted_at - emitted_at (same host clock). Percentiles are computed
by ClickHouse over every stored event, after the sink exited (chDB: one folder per process).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import msgspec

from entroloop.benchmarks.report import Figure

TARGET_P99_S = 2.0
TARGET_RATE = 5000
REPO_ROOT = Path(__file__).resolve().parents[2]
SECTION = "lag"

_LAG_QUERY = r"""
import json, sys
from entroloop.infra.clickhouse.client import connect
c = connect(sys.argv[1])
tables = [r[0] for r in c.query("SELECT name FROM system.tables WHERE database = 'entroloop' AND name IN "
                                "('token_entropy', 'spans', 'audit_index', 'feedback', 'fallbacks')").result_rows]
union = " UNION ALL ".join(
    f"SELECT toFloat64(inserted_at) - toFloat64(emitted_at) AS lag FROM entroloop.{t}" for t in tables)
row = c.query(f"SELECT count(), quantilesExact(0.5, 0.95, 0.99)(lag), max(lag), min(lag) FROM ({union})").result_rows[0]
print(json.dumps({"events": int(row[0]), "p50": row[1][0], "p95": row[1][1], "p99": row[1][2],
                  "max": float(row[2]), "min": float(row[3])}))
"""


def broker_problem(bootstrap: str) -> str | None:
    """None if the broker answers, else why not (one line)."""
    if not bootstrap:
        return "no broker configured (ENTROLOOP_KAFKA_BOOTSTRAP or --broker)"
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    try:
        AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    except KafkaException as exc:
        return f"Kafka broker {bootstrap} is not reachable ({exc.args[0]})"
    return None


def _sample(requests: int, seed: int) -> list[list[Any]]:
    from collectors.synthetic_fleet import SyntheticFleet

    return [request.records for request in SyntheticFleet(seed=seed).requests(requests)]


def _start_sink(bootstrap: str, prefix: str, folder: Path, partitions: int, batch_seconds: float) -> subprocess.Popen:
    env = {
        **os.environ,
        "ENTROLOOP_KAFKA_BOOTSTRAP": bootstrap,
        "ENTROLOOP_TOPIC_PREFIX": prefix,
        "ENTROLOOP_PARTITIONS": str(partitions),
        "ENTROLOOP_DATA_DIR": str(folder),
        "ENTROLOOP_CLICKHOUSE_DSN": f"chdb://{folder / 'clickhouse'}",
    }
    return subprocess.Popen(
        # --until-empty, not --max-idle-s: a sink paused on backpressure receives nothing, and
        # --max-idle-s counts that as idle and exits with the backlog unread (not lost, but unmeasured).
        [sys.executable, "-m", "entroloop.cli", "sink", "clickhouse", "--json", "--until-empty",
         "--batch-seconds", str(batch_seconds), "--log-level", "info", "--session-timeout-s", "10"],
        cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def run(bootstrap: str, rate: float = 2000, seconds: float = 60, partitions: int = 6, batch_seconds: float = 1.0,
        sample_requests: int = 2000, seed: int = 7, progress=lambda text: None) -> dict[str, Any]:
    """Publish ``rate`` requests/s for ``seconds`` through Kafka into a sink; return the lag percentiles."""
    from collectors.publisher import Publisher, PublisherConfig
    from entroloop.contract.ids import uuid7
    from entroloop.infra.kafka_topics import ensure_topics

    prefix = f"lag{int(time.time())}."
    ensure_topics(bootstrap, prefix, partitions)
    progress(f"generating a sample of {sample_requests:,} fleet requests")
    sample = _sample(sample_requests, seed)
    with tempfile.TemporaryDirectory(prefix="entroloop-lag-") as tmp:
        folder = Path(tmp)
        progress("starting the ClickHouse sink")
        sink = _start_sink(bootstrap, prefix, folder, partitions, batch_seconds)
        stderr_lines: list[str] = []
        assigned = threading.Event()

        def watch_stderr() -> None:
            for line in sink.stderr:  # type: ignore[union-attr]
                stderr_lines.append(line)
                if "assigned" in line:
                    assigned.set()

        threading.Thread(target=watch_stderr, daemon=True).start()
        if not assigned.wait(90):
            sink.kill()
            raise RuntimeError("the sink never got its partitions:\n" + "".join(stderr_lines[-30:]))
        publisher = Publisher(PublisherConfig(bootstrap, folder / "spool", topic_prefix=prefix))
        total = int(rate * seconds)
        events = 0
        progress(f"publishing {total:,} requests at {rate:,.0f}/s")
        started = time.monotonic()
        seq = 0
        replace = msgspec.structs.replace
        for i in range(total):
            ahead = i / rate - (time.monotonic() - started)
            if ahead > 0:
                time.sleep(ahead)
            now = time.time()
            request_id = f"lag-{i}"
            for record in sample[i % len(sample)]:
                seq += 1
                publisher.publish(replace(record, event_id=uuid7(now), emitted_at=now, seq=seq, request_id=request_id))
                events += 1
        publish_s = time.monotonic() - started
        delivered = publisher.flush(120)
        stats = publisher.close()
        progress("waiting for the sink to drain")
        out, _ = sink.communicate(timeout=300)
        sink_stats = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
        done = subprocess.run([sys.executable, "-c", _LAG_QUERY, f"chdb://{folder / 'clickhouse'}"], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"lag query failed:\n{done.stderr[-2000:]}")
        lag = json.loads(done.stdout.strip().splitlines()[-1])
    return {
        "rate": rate,
        "seconds": seconds,
        "requests": total,
        "events_sent": events,
        "events_stored": lag["events"],
        "achieved_requests_per_s": total / publish_s,
        "events_per_s": events / publish_s,
        "delivered_all": delivered,
        "publisher": stats,
        "sink": sink_stats,
        "batch_seconds": batch_seconds,
        "partitions": partitions,
        "p50_s": lag["p50"],
        "p95_s": lag["p95"],
        "p99_s": lag["p99"],
        "max_s": lag["max"],
    }


def figures(result: dict[str, Any]) -> list[Figure]:
    rate = result["achieved_requests_per_s"]
    at_target_rate = result["rate"] >= TARGET_RATE
    note = (f"{result['requests']:,} requests ({result['events_sent']:,} events) over {result['seconds']:g} s at "
            f"{rate:,.0f} requests/s = {result['events_per_s']:,.0f} events/s; fleet -> node publisher -> Kafka "
            f"(1 broker, {result['partitions']} partitions per topic) -> 1 ClickHouse sink process (chDB, batch "
            f"{result['batch_seconds']:g} s per partition); "
            f"{result['events_stored']:,} events stored")
    p99_met = result["p99_s"] <= TARGET_P99_S and at_target_rate
    return [
        Figure(SECTION, "emit -> queryable lag p50", result["p50_s"], "s", note=note),
        Figure(SECTION, "emit -> queryable lag p95", result["p95_s"], "s"),
        Figure(SECTION, "emit -> queryable lag p99", result["p99_s"], "s", target=f"<= {TARGET_P99_S:g} s at "
               f"{TARGET_RATE:,} requests/s", met=p99_met, baseline="seconds to 15 minutes",
               note="" if at_target_rate else f"measured at {result['rate']:,.0f} requests/s, below the target rate"),
        Figure(SECTION, "emit -> queryable lag max", result["max_s"], "s"),
        Figure(SECTION, "sustained request rate", rate, "requests/s", target=f"{result['rate']:,.0f} (stated)",
               met=rate >= 0.98 * result["rate"]),
        Figure(SECTION, "events stored / events sent", result["events_stored"] / max(1, result["events_sent"]), "×",
               target="1", met=result["events_stored"] == result["events_sent"]),
    ]


def not_measured(reason: str) -> list[Figure]:
    return [Figure(SECTION, "emit -> queryable lag p99", None, "s", target=f"<= {TARGET_P99_S:g} s at "
                   f"{TARGET_RATE:,} requests/s", note=f"not measured: {reason}; start one with `make services-up`")]
