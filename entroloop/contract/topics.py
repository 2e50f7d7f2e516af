"""Topic registry: every Kafka topic of the v1 contract, its record kind, key, partitions, retention.

All topics share one partition count and are keyed by ``request_id``, so the audit, tokens,
feedback and spans of one request land on the same partition number and joins need no
repartitioning.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

from entroloop.contract.records import (
    Action,
    Alert,
    Audit,
    BadCase,
    DeadLetter,
    Event,
    Fallback,
    Feedback,
    Health,
    IntentScore,
    RetrainRequest,
    Span,
    TokenEntropy,
)

DEFAULT_PARTITIONS = 6
DAY_MS = 24 * 3600 * 1000


@dataclass(frozen=True)
class Topic:
    name: str
    record_type: type[Event]
    table: str
    partitions: int = DEFAULT_PARTITIONS
    retention_ms: int = 7 * DAY_MS
    key: str = "request_id"
    source: bool = False
    """True for topics written by serving nodes / gateways; False for topics derived by streams."""


TOPICS: tuple[Topic, ...] = (
    Topic(TokenEntropy.topic, TokenEntropy, "token_entropy", source=True),
    Topic(Span.topic, Span, "spans", source=True),
    Topic(Audit.topic, Audit, "audit_index", retention_ms=30 * DAY_MS, source=True),
    Topic(Feedback.topic, Feedback, "feedback", retention_ms=30 * DAY_MS, source=True),
    Topic(Fallback.topic, Fallback, "fallbacks", source=True),
    Topic(IntentScore.topic, IntentScore, "intent_scores"),
    Topic(BadCase.topic, BadCase, "bad_cases", retention_ms=90 * DAY_MS),
    Topic(Alert.topic, Alert, "alerts", retention_ms=30 * DAY_MS),
    Topic(Action.topic, Action, "actions", retention_ms=90 * DAY_MS),
    Topic(RetrainRequest.topic, RetrainRequest, "retrain_requests", retention_ms=90 * DAY_MS),
    Topic(Health.topic, Health, "health", retention_ms=DAY_MS),
    Topic(DeadLetter.topic, DeadLetter, "dead_letters", retention_ms=30 * DAY_MS),
)

TOPIC_BY_NAME: dict[str, Topic] = {t.name: t for t in TOPICS}
TOPIC_BY_TYPE: dict[type[Event], Topic] = {t.record_type: t for t in TOPICS}
SOURCE_TOPICS: tuple[str, ...] = tuple(t.name for t in TOPICS if t.source)


def topic_of(record: Event) -> Topic:
    return TOPIC_BY_TYPE[type(record)]


def partition_for(key: str, partitions: int = DEFAULT_PARTITIONS) -> int:
    """Deterministic partition of a key (CRC32, as librdkafka's ``consistent`` partitioner)."""
    return zlib.crc32(key.encode()) % partitions
