"""Identifiers: UUIDv7 event ids, per-node sequence numbers, W3C trace ids.

``derived_event_id`` gives a record made *from* another record a deterministic UUIDv7 (time from
the source, the rest from a hash), so reprocessing the same input yields the same output id and the
sinks' ``event_id`` backstop absorbs it.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import threading
import time
import uuid


def _uuid7_from(ms: int, rand: bytes) -> str:
    """Lay out a UUIDv7 (RFC 9562): 48-bit unix ms, version 7, 74 bits from ``rand``, variant 10."""
    r = int.from_bytes(rand[:10], "big")
    rand_a = (r >> 68) & 0xFFF
    rand_b = r & ((1 << 62) - 1)
    value = (ms & ((1 << 48) - 1)) << 80 | 0x7 << 76 | rand_a << 64 | 0b10 << 62 | rand_b
    return str(uuid.UUID(int=value))


def uuid7(at: float | None = None) -> str:
    """A fresh, time-ordered UUIDv7 string."""
    ms = int((time.time() if at is None else at) * 1000)
    return _uuid7_from(ms, os.urandom(10))


def derived_event_id(source_event_id: str, *parts: object, at: float) -> str:
    """A UUIDv7 that is a pure function of its source and ``parts`` (idempotent reprocessing)."""
    digest = hashlib.blake2b("|".join([source_event_id, *map(str, parts)]).encode(), digest_size=10)
    return _uuid7_from(int(at * 1000), digest.digest())


def new_trace_id() -> str:
    """A W3C trace id: 32 lowercase hex digits, never all zero."""
    return os.urandom(16).hex()


def new_span_id() -> str:
    return os.urandom(8).hex()


class NodeStamper:
    """Issues the common fields of records emitted by one node: event id, time, node id, seq.

    ``seq`` increases by one per record across all topics of the node, so a consumer can count
    exactly which records of a node it has and which it lacks. Thread-safe.
    """

    def __init__(self, node_id: str, start_seq: int = 0) -> None:
        self.node_id = node_id
        self._seq = itertools.count(start_seq)
        self._lock = threading.Lock()

    def stamp(self, at: float | None = None) -> dict[str, object]:
        at = time.time() if at is None else at
        with self._lock:
            seq = next(self._seq)
        return {"event_id": uuid7(at), "emitted_at": at, "node_id": self.node_id, "seq": seq}
