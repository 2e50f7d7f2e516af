"""The aggregating processors' snapshots, and the bookkeeping that makes a restart count each record once.

A processor restored from its snapshot halfway through must publish what one uninterrupted
instance publishes (same records, same ids, same counts); the keeper must skip exactly the
records the restored state covers, per partition.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import msgspec
import pytest
from entroloop.streams.aggregate_snapshots import (
    KEY,
    PARTITION,
    SnapshotKeeper,
    keeps_snapshots,
)
from entroloop.streams.bad_cases import BadCaseJoiner
from entroloop.streams.fallback_rates import FallbackRateMonitor
from entroloop.streams.response_rules import ResponseRuleChecker
from entroloop.streams.retrain_triggers import RetrainTrigger

from .analytics_records import audit, bad_case, fallback


def _traffic() -> list:
    """Four minutes of audits, fallbacks and bad cases over two models (some crossing the limits)."""
    records = []
    for i in range(240):
        at = 6000.0 + i
        model = "m1" if i % 3 else "m2"
        records.append(audit(f"r{i}", model=model, at=at, response="您的余额为120元。" if i % 4 else "保证收益，稳赚不赔"))
        if i % 5 == 0:
            records.append(fallback(f"r{i}", model=model, at=at + 0.1, tier="primary" if i % 2 else "secondary"))
        if i % 2 == 0:
            records.append(bad_case(f"r{i}", ["number"] if i % 3 else ["fact"], model=model, at=at + 0.2))
    return records


def _small_limits() -> list:
    return [FallbackRateMonitor(slo_min_requests=10, circuit_limit=5),
            ResponseRuleChecker(),
            RetrainTrigger(min_requests=10, bad_case_count=8)]


def _run(processor, records: list, end: float) -> list:
    out = []
    for i in range(0, len(records), 25):
        out += processor.process_batch(records[i : i + 25])
        out += processor.on_watermark(records[min(i + 24, len(records) - 1)].emitted_at)
    return out + processor.on_watermark(end)


def _id(record) -> str:
    return record.event_id


@pytest.mark.parametrize("index", range(3), ids=["fallback_rates", "response_rules", "retrain_triggers"])
def test_a_processor_restored_halfway_publishes_what_an_uninterrupted_one_does(index: int) -> None:
    records, end = _traffic(), 6000.0 + 3 * 3600
    uninterrupted = _run(_small_limits()[index], records, end)
    assert uninterrupted, "the traffic must make outputs for the comparison to mean something"

    for cut in (17, 230, 401):  # mid-window, across a window close, late in the stream
        first = _small_limits()[index]
        before = _run(first, records[:cut], records[cut - 1].emitted_at)
        second = _small_limits()[index]
        second.restore(first.snapshot())
        after = _run(second, records[cut:], end)
        # The same records, ids and counts (batches fall elsewhere, so alerts and windows interleave otherwise).
        assert sorted(before + after, key=_id) == sorted(uninterrupted, key=_id), f"cut at {cut}"


def test_without_its_snapshot_a_restarted_processor_publishes_short_windows() -> None:
    """The loss the snapshots prevent: the first half of an open minute is gone with the process."""
    records = [r for r in _traffic() if r.emitted_at < 6060]

    def requests(out: list) -> dict[str, str]:
        return {h.labels["model"]: h.labels["requests"] for h in out
                if h.metric == "fallback_rate_1m" and h.labels["tier"] == "*"}

    whole, restarted = FallbackRateMonitor(), FallbackRateMonitor()
    assert requests(whole.process_batch(records) + whole.on_watermark(7000)) == {"m1": "40", "m2": "20"}
    short = requests(restarted.process_batch(records[len(records) // 2 :]) + restarted.on_watermark(7000))
    assert int(short["m1"]) < 40 and int(short["m2"]) < 20


def test_only_the_aggregating_processors_keep_snapshots() -> None:
    assert all(keeps_snapshots(p) for p in _small_limits())
    assert not keeps_snapshots(BadCaseJoiner())


@dataclass
class _Message:
    topic: str
    partition: int
    offset: int


class _Table:
    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}


def _batch(topic: str, partition: int, offsets: range, records: list) -> list:
    return [(record, _Message(topic, partition, offset)) for record, offset in zip(records, offsets, strict=False)]


def test_the_keeper_skips_what_the_restored_state_covers_per_partition() -> None:
    table, records = _Table(), _traffic()
    first = SnapshotKeeper(FallbackRateMonitor(), table)
    first.restore_once()  # nothing stored yet: an empty state
    seen = _batch("audit", 0, range(10), records[:10]) + _batch("audit", 1, range(5), records[10:15])
    first.processor.process_batch([r for r, _ in first.unseen(seen)])
    first.cover(seen)
    assert first.dirty
    first.take()
    assert not first.dirty and KEY in table.data

    second = SnapshotKeeper(FallbackRateMonitor(), table)
    second.restore_once()
    assert second.processor.requests == first.processor.requests
    redelivered = _batch("audit", 0, range(8, 12), records[8:12]) + _batch("audit", 1, range(3, 7), records[13:17])
    redelivered += _batch("fallbacks", 0, range(2), records[17:19])
    kept = second.unseen(redelivered)
    assert [(m.topic, m.partition, m.offset) for _, m in kept] == [
        ("audit", 0, 10), ("audit", 0, 11), ("audit", 1, 5), ("audit", 1, 6), ("fallbacks", 0, 0), ("fallbacks", 0, 1)]
    assert second.skipped == 4


def test_the_snapshot_goes_to_changelog_partition_zero_of_the_store() -> None:
    class Store(dict):
        _key_partition: dict[bytes, int]

    table = _Table()
    table.data = Store()
    table.data._key_partition = {}
    keeper = SnapshotKeeper(ResponseRuleChecker(), table)
    keeper.cover(_batch("audit", 3, range(7, 8), _traffic()[:1]))
    raw = keeper.take()
    assert table.data[KEY] == raw and table.data._key_partition[KEY] == PARTITION


def test_an_unreadable_snapshot_starts_empty_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    table = _Table()
    table.data[KEY] = b"\x93not a snapshot"
    keeper = SnapshotKeeper(RetrainTrigger(), table)
    with caplog.at_level(logging.ERROR):
        keeper.restore_once()
    assert keeper.restored and keeper.covered == {} and keeper.processor.requests == {}
    assert "cannot be read" in caplog.text


def test_a_snapshot_of_another_processor_is_refused_not_half_applied(caplog: pytest.LogCaptureFixture) -> None:
    table, fallbacks = _Table(), FallbackRateMonitor()
    fallbacks.process_batch(_traffic()[:20])
    writer = SnapshotKeeper(fallbacks, table)
    writer.cover(_batch("audit", 0, range(20), _traffic()[:20]))
    writer.take()
    reader = SnapshotKeeper(RetrainTrigger(), table)
    with caplog.at_level(logging.ERROR):
        reader.restore_once()
    assert reader.covered == {} and "cannot be read" in caplog.text
    with pytest.raises(msgspec.ValidationError):
        RetrainTrigger().restore(fallbacks.snapshot())


def test_the_snapshot_carries_the_newest_event_time_and_older_ones_read_without_it() -> None:
    table = _Table()
    writer = SnapshotKeeper(FallbackRateMonitor(), table)
    writer.cover(_batch("audit", 0, range(3), _traffic()[:3]))
    writer.take(event_time=6002.0)
    reader = SnapshotKeeper(FallbackRateMonitor(), table)
    reader.restore_once()
    assert reader.event_time == 6002.0 and reader.covered == {("audit", 0): 2}

    fields = msgspec.msgpack.decode(table.data[KEY])
    table.data[KEY] = msgspec.msgpack.encode(fields[:2])  # written before the event time was kept
    older = SnapshotKeeper(FallbackRateMonitor(), table)
    older.restore_once()
    assert older.event_time == float("-inf") and older.covered == {("audit", 0): 2}
