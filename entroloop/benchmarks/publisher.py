"""Serving-side publisher: hot-path enqueue latency and delivered throughput against a real broker.

The records are the synthetic fleet's (token entropies, spans, audit, feedback, fallbacks), built
before the clock starts. Latency is timed around each ``publish()`` call while the background thread
encodes and produces (they share the GIL, as in a serving process). Throughput counts from the first
``publish()`` until the broker acknowledged the last record (``flush``), with ``acks=all`` and
idempotence.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from entroloop.benchmarks.report import Figure

TARGET_P99_US = 50.0
TARGET_EVENTS_PER_S = 100_000


def build_records(count: int, seed: int = 7) -> list[Any]:
    """``count`` distinct fleet records (a fleet sample repeated with fresh ids and seqs)."""
    from collectors.synthetic_fleet import SyntheticFleet
    from entroloop.contract.ids import uuid7

    sample = [r for request in SyntheticFleet(seed=seed).requests(1000) for r in request.records]
    out = []
    for i in range(count):
        base = sample[i % len(sample)]
        out.append(msgspec.structs.replace(base, event_id=uuid7(base.emitted_at), seq=i))
    return out


def run(bootstrap: str, events: int = 200_000, topic_prefix: str | None = None) -> dict[str, Any]:
    from collectors.publisher import Publisher, PublisherConfig
    from entroloop.infra.kafka_topics import ensure_topics

    prefix = topic_prefix if topic_prefix is not None else f"bench{int(time.time())}."
    ensure_topics(bootstrap, prefix)
    records = build_records(events)
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
        "events": events,
        "p50_us": float(np.percentile(us, 50)),
        "p99_us": float(np.percentile(us, 99)),
        "p999_us": float(np.percentile(us, 99.9)),
        "max_us": float(us.max()),
        "enqueue_per_s": events / enqueued_s,
        "delivered_per_s": events / total_s if delivered else None,
        "delivered_all": delivered,
        "stats": stats,
    }


def figures(result: dict[str, Any]) -> list[Figure]:
    spooled = result["stats"]["spooled"]
    note = f"{result['events']:,} fleet events, acks=all, idempotent, lz4" + (f"; {spooled:,} spooled" if spooled else "")
    delivered = result["delivered_per_s"]
    return [
        Figure("publisher", "publish() p50", result["p50_us"], "µs", baseline="per-token spans: ~40 µs each, blocking"),
        Figure("publisher", "publish() p99", result["p99_us"], "µs", target=f"< {TARGET_P99_US:g} µs",
               met=result["p99_us"] < TARGET_P99_US, note=f"p99.9 {result['p999_us']:.1f} µs, max {result['max_us']:.0f} µs"),
        Figure("publisher", "enqueue rate", result["enqueue_per_s"], "events/s"),
        Figure("publisher", "delivered to the broker", delivered, "events/s", target=f">= {TARGET_EVENTS_PER_S:,}",
               met=(delivered or 0) >= TARGET_EVENTS_PER_S, note=note),
    ]


__all__ = ["run", "figures", "build_records"]
