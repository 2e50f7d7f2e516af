"""The Faust worker against a plain confluent-kafka loop running the same processors.

Both consumers are worker processes of their own, started the same way and observed the same way
from here, on the same fleet events (``entroloop.collectors.synthetic_fleet``) published beforehand to topics
of their own (a fresh prefix each, so neither sees the other's outputs):

- ``faust``: ``entroloop worker`` (``entroloop.streams.app``), the deployment's worker;
- ``plain``: :func:`plain_loop` below: one confluent-kafka consumer on the same input topics, each
  poll batch decoded with ``entroloop.contract.codec.decode_many`` (as the worker does) and handed to the same processors
  (``entroloop.streams.defaults.default_processors``), outputs produced to their topics, the producer flushed
  and the offsets committed every second (at-least-once, like the worker);
- ``transport``: the same ``entroloop worker`` with processors that do nothing (same inputs, no
  outputs, no state; :func:`faust_transport`): what Faust's fetch, hand-over, decoding and commits
  cost alone, i.e. the most the worker could drain however fast the processors became.

Both are observed the same way, every 20 ms: the consumer group's committed offsets on the fleet's
topics and the worker process's CPU time (all threads, from /proc). The measured span starts at
the group's first commit (so start-up, group join and table recovery are left out) and ends where
the work ended (:func:`end_of_work`: the last ``BUSY_WINDOW_S`` in which the process was busy, >=
``BUSY_CORES``) before the commit that covers every event (a commit comes up to a second after the
work is done; an idle worker uses a few percent of a core). events/s = events committed after the
first commit / the span; CPU per event = the process's CPU time over the span / those events. The
ratio is taken per run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from entroloop.benchmarks.repeats import Repeated, repeat_many
from entroloop.benchmarks.report import Figure

SECTION = "workers"
REPO_ROOT = Path(__file__).resolve().parents[2]
TARGET_RATIO = 0.5
TARGET_EVENTS_PER_S = 20_000
PLAIN_GROUP = "plain-loop"
FAUST_GROUP = "entroloop-streams"  # StreamsConfig.app_id
VARIANTS = (("plain", PLAIN_GROUP), ("faust", FAUST_GROUP), ("transport", FAUST_GROUP))
"""Measured in this order in every run, each on topics of its own."""
_POLL_S = 0.02
BUSY_CORES = 0.3
"""A process using at least this much of a core over ``BUSY_WINDOW_S`` is still working."""
BUSY_WINDOW_S = 0.1
"""Ten of /proc's 10 ms CPU ticks: over one 20 ms sample a single tick of an idle worker's
housekeeping (its fetch long-polls, timers) reads as half a core, and up to a second of idling
before the final commit was counted as work."""
FAUST_WORKER_ARGS = ("worker", "--log-level", "warn")
"""The deployment's worker command line (a unit test parses it with the real CLI: an option renamed
there once left this benchmark unable to start its worker)."""

def fleet_payloads(requests: int, seed: int = 7) -> list[tuple[str, bytes, bytes]]:
    """(topic name without prefix, key, encoded value) of every fleet event a worker consumes."""
    from entroloop.collectors.synthetic_fleet import SyntheticFleet
    from entroloop.contract.codec import encode
    from entroloop.contract.settings import Settings
    from entroloop.contract.topics import TOPIC_BY_TYPE
    from entroloop.streams.defaults import default_processors

    consumed = {TOPIC_BY_TYPE[t].name for p in default_processors(Settings(), with_intent=False) for t in p.inputs}
    out: list[tuple[str, bytes, bytes]] = []
    for request in SyntheticFleet(seed=seed).requests(requests):
        for record in request.records:
            if record.topic in consumed:
                out.append((record.topic, record.request_id.encode(), encode(record)))
    return out


def _publish(bootstrap: str, prefix: str, payloads: list[tuple[str, bytes, bytes]], partitions: int) -> None:
    from confluent_kafka import Producer

    from entroloop.infra.kafka_topics import ensure_topics

    ensure_topics(bootstrap, prefix, partitions)
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.size": 1 << 20,
                         "compression.type": "lz4", "queue.buffering.max.messages": 1_000_000, "acks": "all"})
    for topic, key, value in payloads:
        while True:
            try:
                producer.produce(prefix + topic, value=value, key=key)
                break
            except BufferError:
                producer.poll(0.05)
        producer.poll(0)
    if producer.flush(120):
        raise RuntimeError("the benchmark's events were not all delivered to the broker")


def _end_offsets(bootstrap: str, prefix: str, topics: list[str]) -> dict[tuple[str, int], int]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "entroloop-bench-probe"})
    try:
        ends: dict[tuple[str, int], int] = {}
        meta = consumer.list_topics(timeout=30)
        for name in topics:
            for partition in meta.topics[prefix + name].partitions:
                _, high = consumer.get_watermark_offsets(TopicPartition(prefix + name, partition), timeout=30)
                ends[(prefix + name, partition)] = high
        return ends
    finally:
        consumer.close()


def _changelog_usage(bootstrap: str, prefix: str) -> tuple[int, int]:
    """Records, and bytes of keys and values, in the worker's table changelog topics (the bad-case
    join, the entropy carry): what a restarted worker reads back before it resumes."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "entroloop-bench-probe",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    try:
        assigned: list[TopicPartition] = []
        for name, topic in consumer.list_topics(timeout=30).topics.items():
            if name.startswith(prefix) and name.endswith("-changelog"):
                for partition in topic.partitions:
                    low, high = consumer.get_watermark_offsets(TopicPartition(name, partition), timeout=30)
                    if high > low:
                        assigned.append(TopicPartition(name, partition, low))
        records = size = 0
        if assigned:
            consumer.assign(assigned)
            open_partitions = {(tp.topic, tp.partition) for tp in assigned}
            deadline = time.monotonic() + 120
            while open_partitions and time.monotonic() < deadline:
                for message in consumer.consume(10_000, timeout=1.0):
                    if message.error() is not None:
                        if message.error().code() == KafkaError._PARTITION_EOF:
                            open_partitions.discard((message.topic(), message.partition()))
                        continue
                    records += 1
                    size += len(message.key() or b"") + len(message.value() or b"")
            if open_partitions:
                raise RuntimeError(f"changelog partitions not read to their end in 120 s: {sorted(open_partitions)}")
        return records, size
    finally:
        consumer.close()


def delete_topics(bootstrap: str, prefix: str) -> None:
    """Delete the run's topics (a shared broker would otherwise pile up hundreds of partitions)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    names = [name for name in admin.list_topics(timeout=30).topics if name.startswith(prefix)]
    for future in admin.delete_topics(names, operation_timeout=30).values() if names else ():
        future.result(timeout=60)


def _cpu_s(pid: int) -> float:
    """CPU time (user + system, every thread) of process ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def end_of_work(samples: list[tuple[float, float]], busy_cores: float = BUSY_CORES,
                window_s: float = BUSY_WINDOW_S) -> tuple[float, float]:
    """(time, CPU seconds) where the work ended, from (time, CPU seconds) samples in time order: the
    end of the last stretch of at least ``window_s`` between samples over which the process used at
    least ``busy_cores``; the last sample when no stretch was busy."""
    end = len(samples) - 1
    while end > 0:
        start = end - 1
        while start > 0 and samples[end][0] - samples[start][0] < window_s:
            start -= 1
        (t0, c0), (t1, c1) = samples[start], samples[end]
        if t1 > t0 and (c1 - c0) >= busy_cores * (t1 - t0):
            return samples[end]
        end -= 1
    return samples[-1]


def _watch(proc: subprocess.Popen, bootstrap: str, group: str, ends: dict[tuple[str, int], int],
           timeout_s: float, log_path: Path) -> dict[str, float]:
    """Observe ``group``'s commits on the fleet topics until they cover ``ends``; the rate between
    the first commit and the end of the work that last commit covers (:func:`end_of_work`), and the
    process's CPU time per event meanwhile."""
    from confluent_kafka import Consumer, TopicPartition

    total = sum(ends.values())
    probe = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    tps = [TopicPartition(topic, partition) for topic, partition in ends]
    first: tuple[float, int, float] | None = None
    since_first: list[tuple[float, float]] = []  # (time, cpu) from the first commit on
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the {group} worker exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            committed = sum(max(0, tp.offset) for tp in probe.committed(tps, timeout=10))
            now, cpu = time.monotonic(), _cpu_s(proc.pid)
            if committed and first is None:
                first = (now, committed, cpu)
            if first is not None:
                since_first.append((now, cpu))
            if first is not None and committed >= total:
                events = committed - first[1]
                end, end_cpu = end_of_work(since_first)
                seconds = end - first[0]
                if events <= 0 or seconds <= 0:
                    raise RuntimeError("the first commit already covered every event: publish more (--requests)")
                return {"events": float(total), "events_measured": float(events), "seconds": seconds,
                        "events_per_s": events / seconds, "cpu_us_per_event": (end_cpu - first[2]) / events * 1e6,
                        "cores": (end_cpu - first[2]) / seconds}
            time.sleep(_POLL_S)
    finally:
        probe.close()
    raise TimeoutError(f"the {group} worker did not commit all {total:,} events in {timeout_s:.0f} s:\n"
                       f"{log_path.read_text()[-3000:]}")


def _start(variant: str, bootstrap: str, prefix: str, partitions: int, folder: Path) -> tuple[subprocess.Popen, Path]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "ENTROLOOP_KAFKA_BOOTSTRAP": bootstrap,
           "ENTROLOOP_TOPIC_PREFIX": prefix, "ENTROLOOP_PARTITIONS": str(partitions),
           "ENTROLOOP_DATA_DIR": str(folder / variant),
           # the same processors in both: the plain loop runs no intent scorer (its embedder's speed,
           # ~20 pairs/s per core, is `bench detectors`' figure and would hide the transport's cost)
           "ENTROLOOP_INTENT_SAMPLE_RATE": "0"}
    if variant == "faust":
        args = [sys.executable, "-m", "entroloop.cli", *FAUST_WORKER_ARGS]
    elif variant == "transport":
        args = [sys.executable, "-m", "entroloop.benchmarks.workers", "--faust-transport"]
    else:
        args = [sys.executable, "-m", "entroloop.benchmarks.workers"]
    log_path = folder / f"{variant}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(args, cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    return proc, log_path


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


def measure_once(bootstrap: str, payloads: list[tuple[str, bytes, bytes]], partitions: int = 6,
                 timeout_s: float = 600, progress: Callable[[str], None] = lambda text: None) -> dict[str, float]:
    """One run of every variant (``VARIANTS``, in order) on the same events; their figures and ratios."""
    topics = sorted({topic for topic, _, _ in payloads})
    result: dict[str, float] = {}
    stamp = f"{int(time.time() * 1000)}"
    with tempfile.TemporaryDirectory(prefix="entroloop-bench-workers-") as tmp:
        for variant, group in VARIANTS:
            prefix = f"bw{stamp}{variant[0]}."
            progress(f"{variant}: publishing {len(payloads):,} events")
            _publish(bootstrap, prefix, payloads, partitions)
            ends = _end_offsets(bootstrap, prefix, topics)
            progress(f"{variant}: draining {sum(ends.values()):,} events")
            proc, log_path = _start(variant, bootstrap, prefix, partitions, Path(tmp))
            try:
                measured = _watch(proc, bootstrap, prefix + group, ends, timeout_s, log_path)
                if variant == "faust":
                    records, size = _changelog_usage(bootstrap, prefix)
                    result["faust_changelog_records"], result["faust_changelog_bytes"] = float(records), float(size)
            finally:
                _stop(proc)
                delete_topics(bootstrap, prefix)
            for key, value in measured.items():
                result[f"{variant}_{key}"] = value
    result["ratio"] = result["faust_events_per_s"] / result["plain_events_per_s"]
    result["cpu_ratio"] = result["faust_cpu_us_per_event"] / result["plain_cpu_us_per_event"]
    # What the processors add in the worker: its CPU per event less its transport's, same run.
    result["processors_cpu_us_per_event"] = result["faust_cpu_us_per_event"] - result["transport_cpu_us_per_event"]
    return result


def run(bootstrap: str, requests: int = 100_000, runs: int = 3, partitions: int = 6, seed: int = 7,
        progress: Callable[[str], None] = lambda text: None) -> dict[str, Any]:
    progress(f"generating {requests:,} fleet requests")
    payloads = fleet_payloads(requests, seed)
    count = iter(range(1, runs + 1))

    def once() -> dict[str, float]:
        n = next(count)
        return measure_once(bootstrap, payloads, partitions, progress=lambda text: progress(f"run {n}/{runs}: {text}"))

    repeated = repeat_many(once, runs)
    return {"requests": requests, "events": len(payloads), "partitions": partitions, "repeated": repeated}


def figures(result: dict[str, Any]) -> list[Figure]:
    r: dict[str, Repeated] = result["repeated"]
    note = (f"{result['events']:,} fleet events ({result['requests']:,} requests: tokens, audit, feedback, fallbacks) "
            f"on {result['partitions']} partitions per topic, drained by one worker process each; rate between the "
            "group's first commit and the end of the work (the last 100 ms busy) before the commit covering every "
            "event (both commit every 1 s)")
    faust = r["faust_events_per_s"]
    ratio = r["ratio"]
    return [
        Figure.repeated(SECTION, "Faust worker (`entroloop worker`)", faust, "events/s",
                        target=f">= {TARGET_EVENTS_PER_S:,}", met=faust.median >= TARGET_EVENTS_PER_S, note=note),
        Figure.repeated(SECTION, "plain confluent-kafka loop, same processors", r["plain_events_per_s"], "events/s"),
        Figure.repeated(SECTION, "Faust / plain throughput", ratio, "×", target=f">= {TARGET_RATIO:g}",
                        met=ratio.median >= TARGET_RATIO, baseline="the plain loop in the same run"),
        Figure.repeated(SECTION, "Faust worker CPU per event", r["faust_cpu_us_per_event"], "µs"),
        Figure.repeated(SECTION, "plain loop CPU per event", r["plain_cpu_us_per_event"], "µs"),
        Figure.repeated(SECTION, "Faust / plain CPU per event", r["cpu_ratio"], "×",
                        baseline="the plain loop in the same run"),
        Figure.repeated(SECTION, "Faust worker CPU while draining", r["faust_cores"], "cores"),
        Figure.repeated(SECTION, "Faust table changelog records", r["faust_changelog_records"], "records",
                        note="one per key per batch (the bad-case join keeps an entry per request)"),
        Figure.repeated(SECTION, "Faust table changelog bytes", r["faust_changelog_bytes"], "bytes",
                        note="keys and values: what a restarted worker reads back before it resumes"),
        Figure.repeated(SECTION, "Faust worker, processors doing nothing (its transport alone)",
                        r["transport_events_per_s"], "events/s",
                        note="the same worker and inputs, every processor's work replaced by nothing (no outputs, "
                             "no state): fetch, hand-over, decoding, acks and commits; the most the worker could "
                             "drain if the processors cost nothing"),
        Figure.repeated(SECTION, "Faust transport CPU per event", r["transport_cpu_us_per_event"], "µs"),
        Figure.repeated(SECTION, "processors' CPU per event in the Faust worker", r["processors_cpu_us_per_event"], "µs",
                        baseline="the Faust worker's CPU per event less its transport's, same run"),
    ]


def not_measured(reason: str) -> list[Figure]:
    return [Figure(SECTION, "Faust worker (`entroloop worker`)", None, "events/s",
                   target=f">= {TARGET_EVENTS_PER_S:,}", note=f"not measured: {reason}")]


# --- the plain loop (run as `python -m entroloop.benchmarks.workers`) -----------------------------
def plain_loop(stop: Callable[[], bool] = lambda: False, batch_size: int = 500, commit_interval_s: float = 1.0) -> None:
    """Consume the processors' input topics with one confluent-kafka consumer; settings from the
    environment (ENTROLOOP_KAFKA_BOOTSTRAP, ENTROLOOP_TOPIC_PREFIX), group ``PREFIX + plain-loop``."""
    from collections import defaultdict

    from confluent_kafka import Consumer, Producer

    from entroloop.contract.codec import CodecError, decode_many, encode
    from entroloop.contract.settings import load_settings
    from entroloop.contract.topics import TOPIC_BY_NAME, TOPIC_BY_TYPE
    from entroloop.infra.gc_policy import tune_for_streaming
    from entroloop.streams.app import StreamsConfig, WatermarkCadence
    from entroloop.streams.defaults import default_processors

    settings = load_settings()
    prefix = settings.topic_prefix
    processors = default_processors(settings, with_intent=False)
    # The worker's on_watermark cadence, so both run the processors' window and expiry work alike.
    cadence = {id(p): WatermarkCadence(StreamsConfig.watermark_interval_s) for p in processors}
    routes: dict[type, list[Any]] = defaultdict(list)
    for processor in processors:
        for record_type in processor.inputs:
            routes[record_type].append(processor)
    topics = sorted({TOPIC_BY_TYPE[t].name for t in routes})
    consumer = Consumer({"bootstrap.servers": settings.kafka_bootstrap, "group.id": prefix + PLAIN_GROUP,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    producer = Producer({"bootstrap.servers": settings.kafka_bootstrap, "linger.ms": 5, "acks": "all"})
    consumer.subscribe([prefix + t for t in topics])
    tune_for_streaming()  # as the Faust worker does, so the comparison is about the transport
    last_commit = time.monotonic()
    uncommitted = False
    try:
        while not stop():
            messages = consumer.consume(batch_size, timeout=0.2)
            by_type: dict[type, list[Any]] = defaultdict(list)
            newest: dict[type, dict[tuple[str, int], float]] = defaultdict(dict)  # per partition, as the worker
            messages = [message for message in messages if not message.error()]
            # the worker's batch decoder (entroloop.streams.app._decode_batch)
            decoded = decode_many([message.value() for message in messages], settings.max_record_bytes)
            for message, record in zip(messages, decoded, strict=True):
                name = message.topic().removeprefix(prefix)
                if isinstance(record, CodecError):
                    continue  # the worker would publish a dead letter; the fleet sends none
                if isinstance(record, TOPIC_BY_NAME[name].record_type):
                    by_type[type(record)].append(record)
                    source, seen = (name, message.partition()), newest[type(record)]
                    seen[source] = max(seen.get(source, record.emitted_at), record.emitted_at)
            outputs: list[Any] = []
            for record_type, records in by_type.items():
                for processor in routes[record_type]:
                    outputs.extend(processor.process_batch(records))
                    for source, event_time in newest[record_type].items():
                        cadence[id(processor)].note(event_time, source)
                    if cadence[id(processor)].due():
                        outputs.extend(processor.on_watermark(cadence[id(processor)].event_time))
            for record in outputs:
                while True:
                    try:
                        producer.produce(prefix + record.topic, value=encode(record), key=record.request_id.encode())
                        break
                    except BufferError:
                        producer.poll(0.05)
            producer.poll(0)
            uncommitted = uncommitted or bool(messages)
            if uncommitted and time.monotonic() - last_commit >= commit_interval_s:
                producer.flush(30)  # at-least-once: outputs on the broker before their inputs' offsets
                consumer.commit(asynchronous=False)
                last_commit, uncommitted = time.monotonic(), False
    finally:
        consumer.close()


def faust_transport() -> None:
    """``entroloop worker`` (the deployment's command line) with every processor's batch and
    watermark work replaced by nothing: same subscriptions, no outputs, no state."""
    from entroloop.cli import main as cli_main
    from entroloop.streams import defaults

    every_processor = defaults.default_processors

    def idle_processors(settings: Any, with_intent: bool | None = None) -> list[Any]:
        processors = every_processor(settings, with_intent=False)
        for processor in processors:
            processor.process_batch = lambda records: []
            processor.on_watermark = lambda event_time: []
        return processors

    # The worker looks the factory up when it builds its app (streams/app.py), so this is the one it uses.
    defaults.default_processors = idle_processors
    sys.argv = ["entroloop", *FAUST_WORKER_ARGS]
    cli_main()


def main() -> None:
    if sys.argv[1:] == ["--faust-transport"]:
        faust_transport()
        return
    stopping = False

    def on_term(*_: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, on_term)
    plain_loop(stop=lambda: stopping)
    print(json.dumps({"stopped": True}))


if __name__ == "__main__":
    main()
