"""SinkBatcher: row and time bounds, aligned cuts, backpressure, retries that lose nothing."""

from __future__ import annotations

import pytest
from entroloop.sinks.batching import SinkBackpressure, SinkBatcher, Slice


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class RecordingTarget:
    """Keeps every insert; can be told to fail the next N writes (a database outage)."""

    def __init__(self) -> None:
        self.inserts: list[tuple[str, list[Slice]]] = []
        self.fail_next = 0

    def write_slices(self, topic: str, slices: list[Slice]) -> int:
        if self.fail_next:
            self.fail_next -= 1
            raise ConnectionError("database unreachable")
        self.inserts.append((topic, list(slices)))
        return sum(len(s.records) for s in slices)

    def rows(self) -> list[int]:
        return [r for _, slices in self.inserts for s in slices for r in s.records]


def feed(batcher: SinkBatcher, topic: str, partition: int, start: int, n: int, step: int = 10) -> None:
    for first in range(start, start + n, step):
        last = min(first + step, start + n) - 1
        batcher.add(topic, partition, first, last, list(range(first, last + 1)))


def test_nothing_is_written_before_a_bound_is_reached():
    clock, target = FakeClock(), RecordingTarget()
    batcher = SinkBatcher(target, max_rows=100, max_seconds=1.0, clock=clock)
    feed(batcher, "t", 0, 0, 50)
    assert batcher.flush_due() == [] and target.inserts == []
    clock.now = 1.0
    assert batcher.flush_due() == [("t", 0, 50)]
    assert target.rows() == list(range(50))


def test_row_bound_cuts_at_aligned_offsets_so_redelivery_recuts_the_same_ranges():
    clock, target = FakeClock(), RecordingTarget()
    batcher = SinkBatcher(target, max_rows=100, max_seconds=60.0, clock=clock)
    feed(batcher, "t", 0, 30, 250)  # offsets 30..279
    batcher.flush_due()
    batcher.flush_due()
    ranges = [(s.first, s.last) for _, slices in target.inserts for s in slices]
    assert ranges == [(30, 99), (100, 199)]  # cut at multiples of max_rows, not at 30+100
    # a consumer restarted at the committed offset 100 cuts 100..199 again: same token
    again = SinkBatcher(RecordingTarget(), max_rows=100, max_seconds=60.0, clock=clock)
    feed(again, "t", 0, 100, 150)
    again.flush_due()
    assert [(s.first, s.last) for _, sl in again.target.inserts for s in sl] == [(100, 199)]


def test_one_insert_per_topic_holds_every_partition():
    clock, target = FakeClock(), RecordingTarget()
    batcher = SinkBatcher(target, max_rows=1000, max_seconds=1.0, clock=clock)
    for partition in range(4):
        feed(batcher, "t", partition, 0, 20)
    clock.now = 1.5
    committed = batcher.flush_due()
    assert len(target.inserts) == 1 and len(target.inserts[0][1]) == 4
    assert sorted(committed) == [("t", p, 20) for p in range(4)]


def test_backpressure_refuses_before_taking_and_clears_after_a_flush():
    clock, target = FakeClock(), RecordingTarget()
    batcher = SinkBatcher(target, max_rows=100, max_seconds=1.0, max_buffered_rows=100, clock=clock)
    feed(batcher, "t", 0, 0, 100)
    with pytest.raises(SinkBackpressure) as err:
        batcher.add("t", 0, 100, 109, list(range(100, 110)))
    assert err.value.buffered_rows == 100 and batcher.buffered_rows == 100  # nothing taken
    assert batcher.flush_due() == [("t", 0, 100)]
    assert batcher.has_room(10)
    batcher.add("t", 0, 100, 109, list(range(100, 110)))


def test_failed_writes_keep_rows_back_off_and_land_once_the_target_returns():
    clock, target = FakeClock(), RecordingTarget()
    batcher = SinkBatcher(target, max_rows=50, max_seconds=1.0, max_buffered_rows=200, clock=clock)
    target.fail_next = 3
    feed(batcher, "t", 0, 0, 150)
    commits = []
    with pytest.raises(SinkBackpressure, match="database unreachable"):
        for step in range(100):
            clock.now = step * 0.05
            commits += batcher.flush_due()
            feed(batcher, "t", 0, 150 + step * 10, 10)
    assert batcher.write_errors >= 1 and commits == []  # nothing committed while writes fail
    clock.now += 60
    while batcher.buffered_rows:
        clock.now += 1
        commits += batcher.flush_due()
    assert target.rows() == sorted(set(target.rows())) == list(range(len(target.rows())))
    assert commits[-1] == ("t", 0, len(target.rows()))


def test_write_fallback_without_write_slices():
    class PlainTarget:
        def __init__(self) -> None:
            self.calls: list[tuple] = []

        def write(self, topic, partition, first, last, records):
            self.calls.append((topic, partition, first, last, len(records)))
            return len(records)

    clock, target = FakeClock(), PlainTarget()
    batcher = SinkBatcher(target, max_rows=10, max_seconds=1.0, clock=clock)
    feed(batcher, "t", 2, 0, 10)
    batcher.flush_due()
    assert target.calls == [("t", 2, 0, 9, 10)]


def test_revoked_partition_rows_are_dropped_not_written():
    clock, target = FakeClock(), RecordingTarget()
    batcher = SinkBatcher(target, max_rows=100, max_seconds=1.0, clock=clock)
    feed(batcher, "t", 0, 0, 30)
    feed(batcher, "t", 1, 0, 20)
    assert batcher.drop_partition("t", 0) == 30 and batcher.buffered_rows == 20
    assert batcher.flush_all() == [("t", 1, 20)]
