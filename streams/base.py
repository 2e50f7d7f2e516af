"""What every stream processor is: a plain class with explicit state, no I/O, no framework.

The embedded runner and the Faust app both call ``process_batch`` with decoded records of the
processor's input types and publish whatever it returns; ``on_watermark`` lets windowed
processors close windows by event time. Nothing here knows about Kafka or Faust, so the logic is
tested once and the wiring separately.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, TypeVar

from entroloop.contract.ids import derived_event_id
from entroloop.contract.records import Event

E = TypeVar("E", bound=Event)

# A derived record's seq is source.seq * SEQ_FANOUT + index: deterministic on reprocessing and
# still increasing per derived node for outputs of one source.
SEQ_FANOUT = 64


class Processor:
    """Base class of stream processors."""

    name: ClassVar[str] = "processor"
    inputs: ClassVar[tuple[type[Event], ...]] = ()
    blocking: ClassVar[bool] = False
    """True for a processor whose batches can take long (a neural model, I/O): the Faust worker runs
    it on a thread of its own so its event loop keeps fetching, producing and committing meanwhile.
    The others run on the loop itself: a thread hand-off and the GIL contention that comes with it
    cost more than their batches (tens of milliseconds)."""
    needs_every_partition: ClassVar[bool] = False
    """True for a processor that aggregates over many requests (windows per model and route, trigger
    counts): it must read every partition of its inputs, since the topics are keyed by request id,
    so one worker process runs it (``entroloop worker --role aggregates``). The others judge one
    request at a time and scale with the workers (``--role requests``)."""

    def process(self, record: Event) -> list[Event]:  # pragma: no cover - overridden
        raise NotImplementedError

    def process_batch(self, records: Sequence[Event]) -> list[Event]:
        out: list[Event] = []
        for record in records:
            out.extend(self.process(record))
        return out

    def on_watermark(self, event_time: float) -> list[Event]:
        """Called when event time has advanced to ``event_time``; emit what that closes."""
        return []

    def snapshot(self) -> bytes | None:
        """The whole state as bytes, for a processor whose counts span many records (open windows):
        the Faust worker keeps the newest one with the input offsets it covers, so a restarted worker
        resumes exact counts (``entroloop.streams.aggregate_snapshots``). None: nothing to keep."""
        return None

    def restore(self, snapshot: bytes) -> None:
        """Replace the state with one that ``snapshot`` returned."""
        raise NotImplementedError(f"{self.name} keeps no snapshot")


def derive(source: Event, record_type: type[E], index: int, processor: str, /, **fields: Any) -> E:
    """Build a record derived from ``source`` with a deterministic id, node and seq.

    Re-processing the same source gives a byte-identical record, so idempotent sinks absorb it.
    """
    return record_type(
        event_id=derived_event_id(source.event_id, processor, index, at=source.emitted_at),
        emitted_at=source.emitted_at,
        node_id=f"{processor}@{source.node_id}",
        seq=source.seq * SEQ_FANOUT + index,
        request_id=source.request_id,
        trace_id=source.trace_id,
        **fields,
    )
