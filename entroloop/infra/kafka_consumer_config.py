"""The confluent-kafka consumer configuration of every component that commits by hand.

Sinks and the trainer share one rule: an offset is committed only after the record's effect is
durable (a ClickHouse insert, an audit file, a claimed job), so auto-commit and auto offset store
are off, a new group starts at the earliest offset, and partition EOF events tell a caller that
it has caught up.
"""

from __future__ import annotations

import logging
from typing import Any


def manual_commit_consumer_config(settings: Any, *, group_id: str, client_id: str, logger_name: str,
                                  session_timeout_s: float = 30.0, **overrides: Any) -> dict[str, Any]:
    """Consumer settings for ``group_id``; ``overrides`` are librdkafka properties (dots as given).

    Raises ValueError naming the setting when no broker is configured.
    """
    if not settings.kafka_bootstrap:
        raise ValueError("no broker: set ENTROLOOP_KAFKA_BOOTSTRAP (or pass --broker)")
    session_ms = int(session_timeout_s * 1000)
    config: dict[str, Any] = {
        "bootstrap.servers": settings.kafka_bootstrap,
        "group.id": group_id,
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": True,
        "session.timeout.ms": session_ms,
        "heartbeat.interval.ms": max(1000, session_ms // 3),
        "client.id": client_id,
        "logger": logging.getLogger(logger_name),
    }
    config.update(overrides)
    return config


__all__ = ["manual_commit_consumer_config"]
