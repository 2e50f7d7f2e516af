"""Faust's main sensor with only the per-record bookkeeping Faust itself reads.

Faust calls its ``Monitor`` four times per record (message in, stream event in and out, message
out): counters by topic, stream and task, a ``str(stream)`` lookup, a timing dict per event and a
runtime deque. Those statistics feed Faust's web UI, which the worker does not run
(``web_enabled=False``); profiled in ``entroloop bench workers`` they were ~3 % of the worker's
time. ``LeanMonitor`` keeps what the rest of Faust reads: ``stream_inbound_time`` (the aiokafka
driver's "stream stopped processing" check) and every per-batch hook (commits, end offsets,
rebalances, sends) unchanged. Faust's own counters stay at zero; the worker's figures come from
``entroloop.infra.metrics`` (events in and out per batch) and its ``Health`` records.
"""

from __future__ import annotations

from time import monotonic
from typing import Any

from faust.sensors import Monitor


class LeanMonitor(Monitor):
    """``Monitor`` minus the per-record statistics (see the module doc); set as the app's ``Monitor``."""

    def on_message_in(self, tp: Any, offset: int, message: Any) -> None:
        """Nothing per record: the counters and ``message.time_in`` only feed the web UI."""

    def on_stream_event_in(self, tp: Any, offset: int, stream: Any, event: Any) -> None:
        # Read by the aiokafka driver's slow-processing check: it must stay current.
        self.stream_inbound_time[tp] = monotonic()
        return None

    def on_stream_event_out(self, tp: Any, offset: int, stream: Any, event: Any, state: Any = None) -> None:
        """Nothing per record (the base class times each event for the web UI)."""

    def on_message_out(self, tp: Any, offset: int, message: Any) -> None:
        """Nothing per record (see ``on_message_in``)."""


def hears_each_record(sensors: Any, hook: str) -> bool:
    """Whether any of the app's sensors does something in its per-record ``hook``
    (``on_message_in`` or ``on_message_out``): with only ``LeanMonitor`` (the worker's), nothing does,
    and the caller may skip the sensor delegate's call per record. Read once per batch: a sensor
    added later is heard from the next batch on."""
    lean = getattr(LeanMonitor, hook)
    return any(getattr(type(sensor), hook, None) is not lean for sensor in sensors)


__all__ = ["LeanMonitor", "hears_each_record"]
