"""Emit -> queryable and emit -> alert/action lag: the fleet at a fixed request rate through Kafka.

The serving side is the node publisher (``entroloop.collectors.publisher``) in this process, publishing the
synthetic fleet's traffic at ``rate`` requests/s for ``seconds``. The fleet generator itself runs
at ~600 requests/s on one core, so a sample of requests is generated before the clock starts and
replayed with fresh event ids and seqs; ``emitted_at`` is stamped at the moment of ``publish()``
(the emit).

**Queryable.** The sink is a real `entroloop sink clickhouse` process with its own chDB folder
(broker, publisher and sink share the machine). Each table has ``inserted_at DEFAULT now64(3)``,
set when the row is inserted, i.e. when it becomes queryable; per event, lag = inserted_at -
emitted_at (same host clock). Percentiles are computed by ClickHouse over every stored event,
after the sink exited (chDB: one folder per process). The inserts per table per second come from the distinct ``inserted_at`` values (one per insert), so they
count the same way for any sink. ``baseline_checkout`` runs the sink from another checkout (e.g. the
previous commit) in the same run, so before and after are measured side by side.

A row waits in the sink until its table's batch is due: at least ``batch_seconds`` for the
oldest row of each batch, so p99 is bounded below by about that bound (plus the publisher's
linger and the insert). The two targets pull against each other, so the bench's default bound,
``DEFAULT_BATCH_SECONDS`` = 0.8 s, is the largest of those tried that kept p99 under 1 s at 2,000
requests/s on the 2-core development machine (2026-12-05, one Intel Xeon, 3 runs each, p99 at
2,000 requests/s and inserts per table per second: 0.5 s 0.61 s at 2.13; 0.8 s 0.94 s at 1.33; the
sink's own default of 1 s 1.22 s at 1.07).

**Alerts and actions.** A second phase runs `entroloop worker` (the analytics processors) and
`entroloop actions` (the action runner of the distributed deployment, its own process and consumer
group: the worker runs no runbooks) instead of the sink, acting for real (not a dry run), with the
webhooks answered by a stub HTTP server in this process. Derived records
keep their source's ``emitted_at`` (``entroloop.streams.base.derive``), and the Kafka timestamp of an alert
or action is when the worker produced it, so per alert, lag = its append to the alerts topic
(durable, where actions, circuit breakers and rollbacks read it) - emitted_at, and per action,
its append to the actions topic (after its steps ran) - emitted_at. With ``baseline_checkout``,
each run also measures the phase with `entroloop actions` from that checkout (the worker from this
one), so the action runner's before and after are side by side in the same runs.

Each phase is repeated (``entroloop.benchmarks.repeats``): a figure is the median of the runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import msgspec

from entroloop.benchmarks.checkout import runnable_root
from entroloop.benchmarks.repeats import Repeated, repeat_many
from entroloop.benchmarks.report import Figure

TARGET_P99_S = {2000: 1.0, 5000: 2.0}  # emit -> queryable, by request rate (issue 16)
TARGET_ALERT_P99_S = 2.0
DEFAULT_BATCH_SECONDS = 0.8  # the sink bound the bench runs at (module doc: why not the sink's 1 s)
ALERT_RATE = 2000
BASELINE_PARTS = ("sink", "actions")  # what --baseline-checkout may run from the other checkout
REPO_ROOT = Path(__file__).resolve().parents[2]
SECTION = "lag"
Progress = Callable[[str], None]
STAGES = {  # the sink's own per-stage counters, as figures
    "sink_journal_ms": ("sink: journal commit per flush", "ms"),
    "sink_write_ms": ("sink: insert per table batch", "ms"),
    "sink_commit_ms": ("sink: offset commit per flush", "ms"),
    "sink_flush_share": ("sink: share of time in flushes", "×"),
}

_LAG_QUERY = r"""
import json, sys
from entroloop.infra.clickhouse.client import connect
c = connect(sys.argv[1])
tables = [r[0] for r in c.query("SELECT name FROM system.tables WHERE database = 'entroloop' AND name IN "
                                "('token_entropy', 'spans', 'audit_index', 'feedback', 'fallbacks')").result_rows]
union = " UNION ALL ".join(
    f"SELECT toFloat64(inserted_at) - toFloat64(emitted_at) AS lag FROM entroloop.{t}" for t in tables)
row = c.query(f"SELECT count(), quantilesExact(0.5, 0.95, 0.99)(lag), max(lag), min(lag) FROM ({union})").result_rows[0]
# inserted_at is evaluated once per insert: its distinct values count the inserts, whichever sink made them
inserts = {t: int(c.query(f"SELECT uniqExact(inserted_at) FROM entroloop.{t}").result_rows[0][0]) for t in tables}
print(json.dumps({"events": int(row[0]), "p50": row[1][0], "p95": row[1][1], "p99": row[1][2],
                  "max": float(row[2]), "min": float(row[3]), "inserts": inserts}))
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


def checkout_problem(path: Path) -> str | None:
    """None if ``path`` holds an entroloop checkout whose sink command can run, else why not."""
    if not (path / "sinks" / "kafka_sink.py").is_file() or not (path / "entroloop" / "cli").is_dir():
        return f"{path} is not an entroloop checkout (no sinks/kafka_sink.py)"
    return None


def checkout_commit(path: Path) -> str:
    done = subprocess.run(["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
    return done.stdout.strip() or path.name


def _sample(requests: int, seed: int) -> list[list[Any]]:
    from entroloop.collectors.synthetic_fleet import SyntheticFleet

    return [request.records for request in SyntheticFleet(seed=seed).requests(requests)]


def _env(bootstrap: str, prefix: str, partitions: int, folder: Path, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "ENTROLOOP_KAFKA_BOOTSTRAP": bootstrap,
        "ENTROLOOP_TOPIC_PREFIX": prefix,
        "ENTROLOOP_PARTITIONS": str(partitions),
        "ENTROLOOP_DATA_DIR": str(folder),
        "ENTROLOOP_CLICKHOUSE_DSN": f"chdb://{folder / 'clickhouse'}",
        **extra,
    }


class _Process:
    """A child process whose merged output is kept, with a flag set once a line shows ``ready``."""

    def __init__(self, argv: list[str], env: dict[str, str], ready: str, cwd: Path = REPO_ROOT,
                 separate_stdout: bool = False) -> None:
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE if separate_stdout else subprocess.STDOUT, text=True)
        stream = self.proc.stderr if separate_stdout else self.proc.stdout
        threading.Thread(target=self._watch, args=(stream, ready), daemon=True).start()

    def _watch(self, stream: Any, ready: str) -> None:
        for line in stream:
            self.lines.append(line)
            if ready in line:
                self.ready.set()

    def wait_ready(self, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not self.ready.wait(0.5):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                time.sleep(0.2)  # the last lines
                state = f"exited with {self.proc.returncode}" if self.proc.returncode is not None else \
                    f"did not start within {timeout:.0f} s"
                raise RuntimeError(f"{what} {state}:\n" + "".join(self.lines[-30:]))

    def stop(self, timeout: float = 30) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _publish(bootstrap: str, prefix: str, folder: Path, sample: list[list[Any]], rate: float,
             seconds: float) -> dict[str, Any]:
    """Publish ``rate`` requests/s for ``seconds``; ``emitted_at`` is the moment of ``publish()``."""
    from entroloop.collectors.publisher import Publisher, PublisherConfig
    from entroloop.contract.ids import uuid7

    publisher = Publisher(PublisherConfig(bootstrap, folder / "spool", topic_prefix=prefix))
    total = int(rate * seconds)
    events = seq = 0
    replace = msgspec.structs.replace
    started = time.monotonic()
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
    publisher.close()
    return {"requests": total, "events_sent": events, "publish_s": publish_s, "delivered_all": delivered,
            "achieved_requests_per_s": total / publish_s, "events_per_s": events / publish_s}


# --- emit -> queryable ------------------------------------------------------------------------------
def measure_queryable(bootstrap: str, sample: list[list[Any]], rate: float, seconds: float, partitions: int,
                      batch_seconds: float, checkout: Path = REPO_ROOT, progress: Progress = lambda text: None
                      ) -> dict[str, Any]:
    """One run: publisher -> Kafka -> a sink process (from ``checkout``); lag percentiles per event."""
    from entroloop.infra.kafka_topics import ensure_topics

    prefix = f"lag{time.time_ns()}."
    ensure_topics(bootstrap, prefix, partitions)
    with tempfile.TemporaryDirectory(prefix="entroloop-lag-") as tmp:
        folder = Path(tmp)
        progress("starting the ClickHouse sink")
        sink = _Process(
            # --until-empty, not --max-idle-s: a sink paused on backpressure receives nothing, and
            # --max-idle-s counts that as idle and exits with the backlog unread (not lost, but unmeasured).
            [sys.executable, "-m", "entroloop.cli", "sink", "clickhouse", "--json", "--until-empty",
             "--batch-seconds", str(batch_seconds), "--log-level", "info", "--session-timeout-s", "10"],
            _env(bootstrap, prefix, partitions, folder), ready="assigned", cwd=runnable_root(checkout, folder),
            separate_stdout=True)
        sink.wait_ready(90, "the sink")
        progress(f"publishing {int(rate * seconds):,} requests at {rate:,.0f}/s")
        published = _publish(bootstrap, prefix, folder, sample, rate, seconds)
        progress("waiting for the sink to drain")
        out, _ = sink.proc.communicate(timeout=300)
        sink_stats = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
        done = subprocess.run([sys.executable, "-c", _LAG_QUERY, f"chdb://{folder / 'clickhouse'}"], cwd=REPO_ROOT,
                              capture_output=True, text=True, timeout=300, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"lag query failed:\n{done.stderr[-2000:]}")
        lag = json.loads(done.stdout.strip().splitlines()[-1])
    busiest = max(lag["inserts"].values(), default=0)
    return {
        **_sink_stages(sink_stats),
        **published,
        "events_stored": lag["events"],
        "lost": published["events_sent"] - lag["events"],
        "p50_s": lag["p50"], "p95_s": lag["p95"], "p99_s": lag["p99"], "max_s": lag["max"],
        # the sink runs until drained, a little past the publishing: per publishing second
        "inserts_per_table_s": busiest / published["publish_s"],
        "inserts_by_table": lag["inserts"],
        "sink_writes": sink_stats.get("writes", 0),
    }


def _sink_stages(stats: dict[str, Any]) -> dict[str, float]:
    """Where the sink's flushes spend their time (a sink without these counters gives none)."""
    stages = stats.get("stage_seconds")
    if not stages:
        return {}
    per = lambda seconds, n: 1000 * seconds / n if n else float("nan")
    return {
        "sink_journal_ms": per(stages["journal"], stats.get("journals", 0)),
        "sink_write_ms": per(stages["write"], stats.get("writes", 0)),
        "sink_commit_ms": per(stages["commit"], stats.get("commits", 0)),
        # share of the sink's active time spent blocked in a flush (not polling)
        "sink_flush_share": sum(stages.values()) / stats["active_s"] if stats.get("active_s") else float("nan"),
    }


# --- emit -> alert / action -------------------------------------------------------------------------
class _Webhooks(BaseHTTPRequestHandler):
    """Answers every action webhook with 200 (the gateway and vLLM admin endpoints stand-in)."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        body = b'{"ok": true}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def _topic_lags(bootstrap: str, kafka_topic: str) -> tuple[list[float], Counter[str]]:
    """Per record of ``kafka_topic``: its Kafka timestamp - its emitted_at (seconds); and outcomes."""
    from confluent_kafka import Consumer, KafkaError

    from entroloop.contract.codec import decode

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-lag-{time.time_ns()}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest", "enable.partition.eof": True})
    consumer.subscribe([kafka_topic])
    metadata = consumer.list_topics(kafka_topic, timeout=10).topics[kafka_topic]
    ended: set[int] = set()
    lags: list[float] = []
    outcomes: Counter[str] = Counter()
    deadline = time.monotonic() + 60
    try:
        while len(ended) < len(metadata.partitions) and time.monotonic() < deadline:
            for m in consumer.consume(num_messages=5000, timeout=1.0):
                if m.error() is not None:
                    if m.error().code() == KafkaError._PARTITION_EOF:
                        ended.add(m.partition())
                    continue
                record = decode(m.value())
                lags.append(m.timestamp()[1] / 1000.0 - record.emitted_at)
                outcomes[getattr(record, "outcome", "") or getattr(record, "rule", "")] += 1
    finally:
        consumer.close()
    return lags, outcomes


def _wait_for_group(bootstrap: str, group: str, process: _Process, timeout: float) -> None:
    """Wait until consumer ``group`` is stable with a member (the process got its partitions)."""
    from confluent_kafka import ConsumerGroupState
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and process.proc.poll() is None:
        (described,) = admin.describe_consumer_groups([group]).values()
        with contextlib.suppress(Exception):  # the group does not exist yet
            state = described.result(timeout=10)
            if state.state == ConsumerGroupState.STABLE and state.members:
                return
        time.sleep(0.5)
    process.stop()
    raise RuntimeError(f"{group} did not get its partitions within {timeout:.0f} s:\n" + "".join(process.lines[-30:]))


def _topic_size(bootstrap: str, kafka_topic: str, partitions: int) -> int:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench-lag-watermarks"})
    try:
        return sum(consumer.get_watermark_offsets(TopicPartition(kafka_topic, p), timeout=10)[1] for p in range(partitions))
    finally:
        consumer.close()


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def measure_alerts(bootstrap: str, sample: list[list[Any]], rate: float, seconds: float, partitions: int,
                   progress: Progress = lambda text: None, settle_s: float = 5.0,
                   actions_checkout: Path = REPO_ROOT) -> dict[str, Any]:
    """One run: publisher -> Kafka -> `entroloop worker` + `entroloop actions` (the latter from
    ``actions_checkout``); alert and action lags."""
    from entroloop.contract.records import Action, Alert
    from entroloop.infra.kafka_topics import ensure_topics

    prefix = f"alertlag{time.time_ns()}."
    ensure_topics(bootstrap, prefix, partitions)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Webhooks)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    stub = f"http://127.0.0.1:{server.server_address[1]}"
    workers: list[_Process] = []
    try:
        with tempfile.TemporaryDirectory(prefix="entroloop-alertlag-") as tmp:
            folder = Path(tmp)
            progress("starting `entroloop worker` and `entroloop actions`")
            workers.append(_Process([sys.executable, "-m", "entroloop.cli", "worker", "--log-level", "info"],
                                    _env(bootstrap, prefix, partitions, folder / "worker"), ready="Ready"))
            actions_env = _env(bootstrap, prefix, partitions, folder / "actions", ENTROLOOP_ACTIONS_DRY_RUN="false",
                               ENTROLOOP_ACTIONS_GATEWAY_URL=stub, ENTROLOOP_ACTIONS_VLLM_URL=stub)
            # `entroloop actions` logs nothing when its partitions arrive: its group tells
            workers.append(_Process([sys.executable, "-m", "entroloop.cli", "actions", "--log-level", "info",
                                     "--session-timeout-s", "10"], actions_env, ready="\0never",
                                    cwd=runnable_root(actions_checkout, folder)))
            workers[0].wait_ready(180, "entroloop worker")
            _wait_for_group(bootstrap, f"{prefix}entroloop-actions", workers[1], 180)
            progress(f"publishing {int(rate * seconds):,} requests at {rate:,.0f}/s")
            published = _publish(bootstrap, prefix, folder, sample, rate, seconds)
            progress("waiting for the workers to finish")
            topics = [prefix + Alert.topic, prefix + Action.topic]
            sizes, stable_since, deadline = None, time.monotonic(), time.monotonic() + 600
            while time.monotonic() < deadline:  # done when no alert and no action came for settle_s
                now_sizes = [_topic_size(bootstrap, t, partitions) for t in topics]
                if now_sizes != sizes:
                    sizes, stable_since = now_sizes, time.monotonic()
                elif time.monotonic() - stable_since >= settle_s:
                    break
                time.sleep(1.0)
            for worker in workers:
                worker.stop()
            alert_lags, rules = _topic_lags(bootstrap, topics[0])
            action_lags, outcomes = _topic_lags(bootstrap, topics[1])
    finally:
        for worker in workers:
            worker.stop()
        server.shutdown()
    return {
        **published,
        "alerts": len(alert_lags), "actions": len(action_lags),
        "alert_p50_s": _percentile(alert_lags, 0.5), "alert_p99_s": _percentile(alert_lags, 0.99),
        "action_p50_s": _percentile(action_lags, 0.5), "action_p99_s": _percentile(action_lags, 0.99),
        "alert_rules": dict(rules), "action_outcomes": dict(outcomes),
    }


# --- the whole benchmark ----------------------------------------------------------------------------
def run(bootstrap: str, rates: tuple[float, ...] = (2000, 5000), seconds: float = 15, runs: int = 3,
        partitions: int = 6, batch_seconds: float = DEFAULT_BATCH_SECONDS, alerts: bool = True, baseline_checkout: Path | None = None,
        baseline_of: tuple[str, ...] = BASELINE_PARTS,
        sample_requests: int = 2000, seed: int = 7, progress: Progress = lambda text: None) -> dict[str, Any]:
    """Every phase, each repeated ``runs`` times; returns ``Repeated`` figures and the last run's details."""
    progress(f"generating a sample of {sample_requests:,} fleet requests")
    sample = _sample(sample_requests, seed)
    result: dict[str, Any] = {"runs": runs, "seconds": seconds, "partitions": partitions,
                              "batch_seconds": batch_seconds, "queryable": {}, "details": {}}
    baseline = checkout_commit(baseline_checkout) if baseline_checkout else ""
    for rate in rates:
        count = iter(range(1, runs + 1))

        def once(rate: float = rate, count: Iterator[int] = count) -> dict[str, float]:
            n = next(count)
            tell = lambda text: progress(f"{rate:,.0f} req/s, run {n}/{runs}: {text}")
            out: dict[str, float] = {}
            if baseline_checkout and "sink" in baseline_of and rate == rates[0]:
                before = measure_queryable(bootstrap, sample, rate, seconds, partitions, batch_seconds,
                                           checkout=baseline_checkout, progress=lambda t: tell(f"[sink at {baseline}] {t}"))
                out.update({f"before_{k}": float(before[k]) for k in ("p50_s", "p99_s", "lost", "inserts_per_table_s")})
            after = measure_queryable(bootstrap, sample, rate, seconds, partitions, batch_seconds, progress=tell)
            result["details"][f"queryable_{rate:g}"] = after
            out.update({k: float(after[k]) for k in ("p50_s", "p95_s", "p99_s", "max_s", "lost",
                                                       "achieved_requests_per_s", "events_per_s", "inserts_per_table_s",
                                                       *STAGES) if k in after})
            return out

        result["queryable"][rate] = repeat_many(once, runs)
    if alerts:
        count = iter(range(1, runs + 1))

        def alert_once() -> dict[str, float]:
            n = next(count)
            tell = lambda text: progress(f"alerts at {ALERT_RATE:,} req/s, run {n}/{runs}: {text}")
            before: dict[str, float] = {}
            if baseline_checkout and "actions" in baseline_of:
                old = measure_alerts(bootstrap, sample, ALERT_RATE, seconds, partitions, actions_checkout=baseline_checkout,
                                     progress=lambda t: tell(f"[actions at {baseline}] {t}"))
                result["details"]["alerts_before"] = old
                before = {f"before_{k}": float(old[k]) for k in ("alert_p99_s", "action_p50_s", "action_p99_s", "actions")}
            out = measure_alerts(bootstrap, sample, ALERT_RATE, seconds, partitions, progress=tell)
            if before:  # the ratio per run: both phases saw the same load
                before["action_p99_before_over_after"] = before["before_action_p99_s"] / max(float(out["action_p99_s"]), 1e-9)
            result["details"]["alerts"] = out
            return {**{k: float(out[k]) for k in ("alert_p50_s", "alert_p99_s", "action_p50_s", "action_p99_s",
                                                  "alerts", "actions")},
                    "alert_phase_requests_per_s": float(out["achieved_requests_per_s"]), **before}

        result["alerts"] = repeat_many(alert_once, runs)
    result["baseline"] = baseline
    return result


def summary(result: dict[str, Any]) -> dict[str, Any]:
    """The medians as one flat dict (the `--json` line)."""
    out: dict[str, Any] = {"runs": result["runs"], "seconds": result["seconds"], "partitions": result["partitions"]}
    for i, (rate, figures) in enumerate(result["queryable"].items()):
        for key, measured in figures.items():
            out[f"{key}@{rate:g}"] = measured.median
            if i == 0:  # the first (default 2,000 requests/s) rate also under the plain names
                out[key] = measured.median
    for key, measured in (result.get("alerts") or {}).items():
        out[key] = measured.median
    if result.get("baseline"):
        out["baseline"] = result["baseline"]
    return out


def _rate_note(figures: dict[str, Repeated], seconds: float, partitions: int, batch_seconds: float) -> str:
    return (f"{figures['achieved_requests_per_s'].median:,.0f} requests/s = {figures['events_per_s'].median:,.0f} "
            f"events/s for {seconds:g} s; fleet -> node publisher -> Kafka (1 broker, {partitions} partitions per "
            f"topic) -> 1 ClickHouse sink process (chDB, one insert per table per {batch_seconds:g} s, clock from "
            "the broker timestamp); broker, publisher and sink on this machine's cores")


def figures(result: dict[str, Any]) -> list[Figure]:
    out: list[Figure] = []
    seconds, partitions, batch_seconds = result["seconds"], result["partitions"], result["batch_seconds"]
    for rate, f in result["queryable"].items():
        target = TARGET_P99_S.get(int(rate))
        at = f"at {rate:,.0f} req/s"
        reached = f["achieved_requests_per_s"].median >= 0.98 * rate
        out += [
            Figure.repeated(SECTION, f"emit -> queryable lag p50 {at}", f["p50_s"], "s",
                            note=_rate_note(f, seconds, partitions, batch_seconds)),
            Figure.repeated(SECTION, f"emit -> queryable lag p99 {at}", f["p99_s"], "s",
                            target="" if target is None else f"<= {target:g} s",
                            met=None if target is None else bool(f["p99_s"].median <= target and reached),
                            note="" if reached else "publisher fell short of the stated rate"),
            Figure.repeated(SECTION, f"emit -> queryable lag max {at}", f["max_s"], "s"),
            Figure.repeated(SECTION, f"inserts per second, busiest table, {at}", f["inserts_per_table_s"], "1/s",
                            target="≈ 1", met=bool(f["inserts_per_table_s"].median <= 1.5)),
            Figure.repeated(SECTION, f"events lost {at}", f["lost"], "events", target="0",
                            met=f["lost"].high == 0),
        ]
        out += [Figure.repeated(SECTION, f"{name} {at}", f[key], unit) for key, (name, unit) in STAGES.items() if key in f]
        if "before_p99_s" in f:
            before = f"the sink from {result['baseline']}, same runs"
            out += [
                Figure.repeated(SECTION, f"before: emit -> queryable lag p50 {at}", f["before_p50_s"], "s", note=before),
                Figure.repeated(SECTION, f"before: emit -> queryable lag p99 {at}", f["before_p99_s"], "s", note=before),
                Figure.repeated(SECTION, f"before: inserts per second, busiest table, {at}",
                                f["before_inserts_per_table_s"], "1/s"),
                Figure.repeated(SECTION, f"before: events lost {at}", f["before_lost"], "events"),
            ]
    alerts = result.get("alerts")
    if alerts:
        detail = result["details"].get("alerts", {})
        note = (f"`entroloop worker` + `entroloop actions` (not a dry run; webhooks to a local stub); last run: {detail.get('alerts', 0):,} alerts "
                f"{detail.get('alert_rules', {})}, {detail.get('actions', 0):,} actions {detail.get('action_outcomes', {})}; "
                "time to the record's append to its Kafka topic")
        at = f"at {ALERT_RATE:,} req/s"
        out += [
            Figure.repeated(SECTION, f"emit -> alert in Kafka p50 {at}", alerts["alert_p50_s"], "s", note=note),
            Figure.repeated(SECTION, f"emit -> alert in Kafka p99 {at}", alerts["alert_p99_s"], "s",
                            target=f"<= {TARGET_ALERT_P99_S:g} s", met=bool(alerts["alert_p99_s"].median <= TARGET_ALERT_P99_S)),
            Figure.repeated(SECTION, f"emit -> action executed p50 {at}", alerts["action_p50_s"], "s"),
            Figure.repeated(SECTION, f"emit -> action executed p99 {at}", alerts["action_p99_s"], "s",
                            target=f"<= {TARGET_ALERT_P99_S:g} s", met=bool(alerts["action_p99_s"].median <= TARGET_ALERT_P99_S),
                            note="batches of what one poll fetched, webhooks on a bounded pool"),
        ]
        if "before_action_p99_s" in alerts:
            before = f"`entroloop actions` from {result['baseline']}, the worker from this checkout, same runs"
            out += [
                Figure.repeated(SECTION, f"before: emit -> action executed p50 {at}", alerts["before_action_p50_s"], "s",
                                note=before),
                Figure.repeated(SECTION, f"before: emit -> action executed p99 {at}", alerts["before_action_p99_s"], "s",
                                note=before),
                Figure.repeated(SECTION, f"before: emit -> alert in Kafka p99 {at}", alerts["before_alert_p99_s"], "s"),
                Figure.repeated(SECTION, f"emit -> action executed p99, before / after, {at}",
                                alerts["action_p99_before_over_after"], "×", note="ratio taken per run"),
            ]
    return out


def not_measured(reason: str) -> list[Figure]:
    return [Figure(SECTION, "emit -> queryable lag p99 at 2,000 req/s", None, "s", target="<= 1 s",
                   note=f"not measured: {reason}; start one with `make services-up`")]
