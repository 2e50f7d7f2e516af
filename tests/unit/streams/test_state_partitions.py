"""streams/app.py's table-state processors: each key's changelog record goes to the input partition
of the record that wrote it (co-partitioning), whether the batch is handed over whole (a spec with
``key_of``) or one input partition at a time (a spec without)."""

from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter
from typing import ClassVar

from entroloop.streams.app import StreamsApp, StreamsConfig
from entroloop.streams.base import Processor
from entroloop.streams.table_state import TableStateSpec

from entroloop.contract.ids import NodeStamper
from entroloop.contract.records import Event, Feedback


@dataclass
class FakeMessage:
    partition: int
    offset: int
    key: bytes


class Counting(Processor):
    """Counts each request's feedback in its state; remembers the batches it was handed."""

    inputs = (Feedback,)
    table_state: ClassVar[TableStateSpec[int]]

    def __init__(self) -> None:
        self.state: dict[str, int] = {}
        self.calls: list[list[str]] = []

    def process_batch(self, records: list[Event]) -> list[Event]:
        self.calls.append([record.request_id for record in records])
        for record in records:
            self.state[record.request_id] = self.state.get(record.request_id, 0) + 1
        return []


def _int_spec(name: str, **extra: object) -> TableStateSpec[int]:
    return TableStateSpec(name, lambda n: str(n).encode(), lambda raw: int(raw), **extra)  # type: ignore[arg-type]


class WholeBatch(Counting):
    name = "whole_batch"
    table_state = _int_spec("whole_batch", key_of=attrgetter("request_id"))


class PerPartition(Counting):
    name = "per_partition"
    table_state = _int_spec("per_partition")


def _batch() -> list[tuple[Feedback, FakeMessage]]:
    """Feedback of six requests from three input partitions, interleaved as a fetch hands them over;
    request ``r0`` twice."""
    stamper = NodeStamper("n")
    placed = [("r0", 2), ("r1", 0), ("r2", 1), ("r0", 2), ("r3", 0), ("r4", 1), ("r5", 2)]
    return [(Feedback(**stamper.stamp(), request_id=rid, rating=1), FakeMessage(partition, offset, rid.encode()))
            for offset, (rid, partition) in enumerate(placed)]


def test_each_keys_changelog_record_goes_to_its_records_partition_with_or_without_key_of() -> None:
    whole, per_partition = WholeBatch(), PerPartition()
    streams = StreamsApp(StreamsConfig(bootstrap="127.0.0.1:1", topic_prefix="p."), [whole, per_partition])
    streams._run_processors(Feedback.topic, streams.processors, _batch())
    expected = [(2, b"r0", b"2"), (0, b"r1", b"1"), (1, b"r2", b"1"), (0, b"r3", b"1"), (1, b"r4", b"1"),
                (2, b"r5", b"1")]
    for processor in (whole, per_partition):
        records = streams.table_states[id(processor)].drain(unsealed=False)
        assert sorted(records) == sorted(expected), processor.name
    assert whole.calls == [["r0", "r1", "r2", "r0", "r3", "r4", "r5"]]  # one call, in the fetch's order
    assert sorted(per_partition.calls) == [["r0", "r0", "r5"], ["r1", "r3"], ["r2", "r4"]]  # one per partition


def test_a_write_after_the_batch_goes_to_the_partition_the_key_was_written_to() -> None:
    whole = WholeBatch()
    streams = StreamsApp(StreamsConfig(bootstrap="127.0.0.1:1", topic_prefix="p."), [whole])
    streams._run_processors(Feedback.topic, streams.processors, _batch())
    state = streams.table_states[id(whole)]
    state.drain(unsealed=False)
    del state["r4"]  # expiry, on a watermark: no record in hand
    assert state.drain() == [(1, b"r4", None)]
