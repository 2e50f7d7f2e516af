"""Event-time window arithmetic and records synthesized by a window rather than by one source.

``derive`` (streams/base.py) builds a record from one source record. A window result has no single
source: it summarises everything in the window. Its identity must still be deterministic, so a
replay of the same events produces byte-identical results and idempotent sinks absorb them: the id
is a hash of the processor, the window key and the window end.
"""

from __future__ import annotations

import math
from typing import Any, TypeVar

from entroloop.streams.base import SEQ_FANOUT

from entroloop.contract.ids import derived_event_id
from entroloop.contract.records import Event

E = TypeVar("E", bound=Event)

MAX_AHEAD_OF_CLOCK_S = 1.0
"""How far ahead of the reader's own clock a record's ``emitted_at`` may move event time.

Decoding accepts records up to ``ENTROLOOP_EVENT_MAX_FUTURE_S`` (a day) ahead, so that a node with
a wrong clock is not dead-lettered. Its records must not close windows, though: one record an hour
ahead made the watermark jump an hour, closed every window in between and made every later
on-time record late (dropped from its window) for that hour. Event time cannot really be ahead of
the time of day, so the watermark takes such a record's time as the reader's clock plus this
margin (windows then close a little later when the reader's own clock is behind; never earlier).
The record itself is still counted in the window its own ``emitted_at`` names."""


def event_time_ceiling(now: float) -> float:
    """The latest event time a record read at wall time ``now`` may move the watermark to."""
    return now + MAX_AHEAD_OF_CLOCK_S


def window_start(event_time: float, size_s: float) -> float:
    """Start of the tumbling window of length ``size_s`` (aligned to the epoch) holding ``event_time``."""
    return math.floor(event_time / size_s) * size_s


def synthesize(
    record_type: type[E],
    processor: str,
    key: str,
    at: float,
    index: int = 0,
    **fields: Any,
) -> E:
    """A record emitted for a window or a trigger ``key`` closing at event time ``at``.

    ``node_id`` names the processor and the key, and ``seq`` grows with ``at``: a key's windows
    close in event-time order, so each synthetic node's seq increases, as the contract asks.
    ``request_id`` carries the key so every result of one key lands on one partition.
    """
    return record_type(
        event_id=derived_event_id(key, processor, index, at=at),
        emitted_at=at,
        node_id=f"{processor}@{key}",
        seq=int(at) * SEQ_FANOUT + index,
        request_id=key,
        **fields,
    )
