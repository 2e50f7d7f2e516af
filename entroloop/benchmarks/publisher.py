"""Serving-side publisher: hot-path enqueue latency and delivered throughput against a real broker.

The records are the synthetic fleet's (token entropies, spans, audit, feedback, fallbacks), built
before the clock starts. Latency is timed around each ``publish()`` call while the background thread
encodes and produces (they share the GIL, as in a serving process). Throughput counts from the first
``publish()`` until the broker acknowledged the last record (``flush``), with ``acks=all`` and
idempotence. The baseline is a bare confluent-kafka ``Producer`` with the same config sending the
same records, measured in the same round; rounds repeat (``entroloop.benchmarks.repeats``) with the
order alternating, and every figure is the median of the rounds with their spread.
"""

from __future__ import annotations

import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from entroloop.benchmarks.repeats import DEFAULT_RUNS, Repeated, repeat_many
from entroloop.benchmarks.report import Figure

TARGET_P99_US = 50.0
TARGET_EVENTS_PER_S = 100_000


def build_records(count: int, seed: int = 7) -> list[Any]:
    """``count`` distinct fleet records (a fleet sample repeated with fresh ids and seqs)."""
    from entroloop.collectors.synthetic_fleet import SyntheticFleet
    from entroloop.contract.ids import uuid7

    sample = [r for request in SyntheticFleet(seed=seed).requests(1000) for r in request.records]
    out = []
    for i in range(count):
        base = sample[i % len(sample)]
        out.append(msgspec.structs.replace(base, event_id=uuid7(base.emitted_at), seq=i))
    return out


def publish_once(bootstrap: str, prefix: str, records: list[Any]) -> dict[str, Any]:
    """The node publisher: ``publish()`` every record (timed one by one), then ``flush`` until acked."""
    from entroloop.collectors.publisher import Publisher, PublisherConfig

    events = len(records)
    latencies = np.empty(events, dtype=np.int64)
    with tempfile.TemporaryDirectory() as spool_dir:
        publisher = Publisher(PublisherConfig(bootstrap, Path(spool_dir), topic_prefix=prefix))
        clock = time.perf_counter_ns
        publish = publisher.publish
        started = time.perf_counter()
        for i, record in enumerate(records):
            t0 = clock()
            publish(record)
            latencies[i] = clock() - t0
        enqueued_s = time.perf_counter() - started
        delivered = publisher.flush(300)
        total_s = time.perf_counter() - started
        stats = publisher.close()
    us = latencies / 1000.0
    return {
        "p50_us": float(np.percentile(us, 50)),
        "p99_us": float(np.percentile(us, 99)),
        "p999_us": float(np.percentile(us, 99.9)),
        "max_us": float(us.max()),
        "enqueue_per_s": events / enqueued_s,
        "delivered_per_s": events / total_s if delivered else 0.0,
        "delivered_all": delivered,
        "stats": stats,
    }


def bare_producer_once(bootstrap: str, prefix: str, records: list[Any]) -> float:
    """The baseline: a bare confluent-kafka Producer with the publisher's own producer config, encoding
    and producing the same records (same topics, keys, codec) in the caller's thread, then flushing.
    Returns delivered records/s (0 if any delivery failed)."""
    from confluent_kafka import Producer

    from entroloop.collectors.publisher import PublisherConfig
    from entroloop.contract import codec

    with tempfile.TemporaryDirectory() as spool_dir:
        producer = Producer(PublisherConfig(bootstrap, Path(spool_dir), topic_prefix=prefix).producer_config())
    failed = 0

    def on_delivery(err, _msg) -> None:
        nonlocal failed
        if err is not None:
            failed += 1

    produce, encode, poll = producer.produce, codec.encode, producer.poll
    started = time.perf_counter()
    for i, record in enumerate(records):
        value = encode(record)
        while True:
            try:
                produce(prefix + record.topic, value, record.request_id.encode(), on_delivery=on_delivery)
                break
            except BufferError:
                poll(0.05)
        if i % 10_000 == 0:
            poll(0)
    left = producer.flush(300)
    total_s = time.perf_counter() - started
    return len(records) / total_s if not (left or failed) else 0.0


ROUND_KEYS = ("p50_us", "p99_us", "p999_us", "max_us", "enqueue_per_s", "delivered_per_s")


def run(bootstrap: str, events: int = 200_000, topic_prefix: str | None = None, runs: int = DEFAULT_RUNS,
        progress: Callable[[str], None] = lambda message: None, warm_up: int = 2_000) -> dict[str, Any]:
    """``runs`` rounds of the node publisher and a bare Producer on the same records (order alternating
    per round), after an untimed warm-up of ``warm_up`` records through each; per figure the value of
    every round and the load average around it (JSON-friendly; ``figures`` turns them into medians and
    spreads)."""
    from entroloop.infra.kafka_topics import ensure_topics

    prefix = topic_prefix if topic_prefix is not None else f"bench{int(time.time())}."
    ensure_topics(bootstrap, prefix)
    records = build_records(events)
    # Fresh topics: the first producer waits on partition leaders and the broker's idempotence
    # coordinator ("Coordinator load in progress"), which once made a first round's bare Producer
    # 2.2x slower than the next. Both sides send a few records first, outside the timed rounds (and
    # outside the counters: ``stats`` and the topics' record count are the rounds' own).
    progress(f"warm-up: {warm_up:,} records through each side, not timed")
    warm = build_records(warm_up, seed=8)
    bare_producer_once(bootstrap, prefix, warm)
    publish_once(bootstrap, prefix, warm)
    counters: dict[str, int] = {}
    all_delivered = True
    round_no = 0

    def one_round() -> dict[str, float]:
        nonlocal all_delivered, round_no
        round_no += 1
        progress(f"round {round_no}/{runs}: node publisher and bare Producer, {events:,} records each")
        bare_first = round_no % 2 == 0
        bare = bare_producer_once(bootstrap, prefix, records) if bare_first else None
        mine = publish_once(bootstrap, prefix, records)
        if bare is None:
            bare = bare_producer_once(bootstrap, prefix, records)
        all_delivered = all_delivered and mine["delivered_all"] and bare > 0
        for key, value in mine["stats"].items():
            counters[key] = counters.get(key, 0) + int(value)
        numbers = {key: mine[key] for key in ROUND_KEYS}
        numbers["bare_delivered_per_s"] = bare
        numbers["delivered_ratio"] = mine["delivered_per_s"] / bare if bare else 0.0
        return numbers

    repeated = repeat_many(one_round, runs)
    result: dict[str, Any] = {"events": events, "runs": runs, "warm_up": warm_up, "delivered_all": all_delivered,
                              "stats": counters}
    for key, measured in repeated.items():
        result[key] = measured.median
    result["rounds"] = {key: {"values": list(m.values), "load_averages": list(m.load_averages)}
                        for key, m in repeated.items()}
    return result


def _repeated(result: dict[str, Any], key: str) -> Repeated:
    r = result["rounds"][key]
    return Repeated(tuple(r["values"]), tuple(r["load_averages"]))


def figures(result: dict[str, Any]) -> list[Figure]:
    spooled = result["stats"].get("spooled", 0)
    note = (f"{result['events']:,} fleet events per run after an untimed warm-up of {result.get('warm_up', 0):,}, "
            "acks=all, idempotent, lz4"
            + (f"; {spooled:,} spooled" if spooled else "")
            + ("" if result["delivered_all"] else "; NOT every record was delivered in every run"))
    figure = Figure.repeated
    delivered = result["delivered_per_s"]
    bare = result["bare_delivered_per_s"]
    return [
        figure("publisher", "publish() p50", _repeated(result, "p50_us"), "µs",
               baseline="per-token spans: ~40 µs each, blocking"),
        figure("publisher", "publish() p99", _repeated(result, "p99_us"), "µs", target=f"< {TARGET_P99_US:g} µs",
               met=result["p99_us"] < TARGET_P99_US,
               note=f"p99.9 {result['p999_us']:.1f} µs, max {result['max_us']:.0f} µs (medians of the runs)"),
        figure("publisher", "enqueue rate", _repeated(result, "enqueue_per_s"), "events/s"),
        figure("publisher", "delivered to the broker", _repeated(result, "delivered_per_s"), "events/s",
               target=f">= {TARGET_EVENTS_PER_S:,}", met=delivered >= TARGET_EVENTS_PER_S, note=note),
        figure("publisher", "bare confluent-kafka Producer, delivered", _repeated(result, "bare_delivered_per_s"),
               "events/s", baseline="same producer config, records, topics and keys; encode + produce in the "
               "caller's thread, then flush; measured in the same runs"),
        figure("publisher", "delivered: node publisher / bare Producer", _repeated(result, "delivered_ratio"), "×",
               baseline=f"medians {delivered:,.0f} vs {bare:,.0f} events/s; ratio taken per run"),
    ]


__all__ = ["bare_producer_once", "build_records", "figures", "publish_once", "run"]
