"""Prometheus metrics of every entroloop process (prometheus-client), one vocabulary for all.

Each long-running process (gateway, stream worker, sinks, trainer, action runner) counts what it
consumes, produces and dead-letters per topic with the same metric names, labelled by
``component``, so one dashboard or alert rule covers all of them. The gateway serves them at its
own ``GET /metrics``; the other processes start a small HTTP server on ``ENTROLOOP_METRICS_PORT``
(:func:`serve_metrics`; 0 = off). Compose healthchecks read them.

Labels never carry ids, tenants, user ids or text: only component, topic, table, partition,
runbook, outcome and HTTP path/status, so cardinality stays bounded and no secret or PII leaves
through a scrape.
"""

from __future__ import annotations

import logging
import time

from prometheus_client import (
    REGISTRY,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    start_http_server,
)

log = logging.getLogger(__name__)

EVENTS_IN = Counter("entroloop_events_in", "Records consumed (decoded or not), per topic.", ["component", "topic"])
EVENTS_OUT = Counter("entroloop_events_out", "Records produced or stored, per topic.", ["component", "topic"])
DEAD_LETTERS = Counter("entroloop_dead_letters", "Records sent to the dead-letter topic, per source topic.",
                       ["component", "topic"])
CONSUMER_LAG = Gauge("entroloop_consumer_lag", "Messages behind the partition's end (high watermark - position).",
                     ["component", "topic", "partition"])
TABLE_ENTRIES = Gauge("entroloop_table_entries", "Keys a stream worker holds in a processor's durable state table.",
                      ["component", "table"])
TABLE_EVICTED = Counter("entroloop_table_evicted", "Keys a stream worker dropped from a processor's state table to "
                        "keep it under its bound (ENTROLOOP_BADCASE_JOIN_MAX_REQUESTS).", ["component", "table"])
LATE_EVENTS = Counter("entroloop_late_events", "Events a stream worker's windowed processor dropped because their "
                      "window had closed (event time behind the watermark by more than ENTROLOOP_WINDOW_GRACE_S).",
                      ["component", "processor"])
EVENTS_AHEAD = Counter("entroloop_events_ahead_of_clock", "Records whose emitted_at was ahead of the stream "
                       "reader's clock (a producer's clock is wrong): their event time moved the watermark only "
                       "as far as the reader's clock.", ["component"])
SPOOL_BYTES = Gauge("entroloop_spool_bytes", "Bytes waiting in the node publisher's disk spool.", ["component"])
INSERT_SECONDS = Histogram("entroloop_insert_seconds", "Duration of one sink write, per table.", ["table"],
                           buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0))
ACTIONS = Counter("entroloop_actions", "Runbook steps run, per runbook and outcome.", ["runbook", "outcome"])
LAST_COMMIT = Gauge("entroloop_last_commit_timestamp_seconds", "Unix time of the last successful offset commit.",
                    ["component"])
HTTP_REQUESTS = Counter("entroloop_http_requests", "Gateway requests answered, per route template and status.",
                        ["path", "status"])


def mark_commit(component: str) -> None:
    """Record a successful offset commit now (healthchecks alert on its age)."""
    LAST_COMMIT.labels(component).set(time.time())


def serve_metrics(port: int, addr: str = "0.0.0.0", registry: CollectorRegistry = REGISTRY) -> bool:
    """Serve ``/metrics`` on ``port`` in a daemon thread; ``port`` 0 serves nothing. True if serving.

    A port already in use is logged, not raised: metrics must never stop a worker or sink."""
    if not port:
        return False
    try:
        start_http_server(port, addr=addr, registry=registry)
    except OSError as exc:
        log.error("entroloop: metrics not served on %s:%d (%s); set ENTROLOOP_METRICS_PORT to a free port", addr, port, exc)
        return False
    return True


__all__ = [
    "ACTIONS",
    "CONSUMER_LAG",
    "DEAD_LETTERS",
    "EVENTS_IN",
    "EVENTS_OUT",
    "HTTP_REQUESTS",
    "INSERT_SECONDS",
    "LAST_COMMIT",
    "SPOOL_BYTES",
    "mark_commit",
    "serve_metrics",
]
