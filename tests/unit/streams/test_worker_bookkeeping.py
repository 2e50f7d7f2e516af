"""streams/app.py bookkeeping without a broker: the commit age from the commit call, the
on_watermark cadence, and table writes coalesced per key per batch."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import defaultdict, namedtuple
from typing import Any

import pytest
from entroloop.streams.app import (
    CommitTracker,
    StreamsApp,
    StreamsConfig,
    WatermarkCadence,
)
from entroloop.streams.table_state import TableState, TableStateSpec
from entroloop.streams.windowing import MAX_AHEAD_OF_CLOCK_S, event_time_ceiling

from entroloop.contract.ids import NodeStamper
from entroloop.contract.records import Audit

TP = namedtuple("TP", "topic partition")
IN = TP("p.in", 0)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeConsumer:
    """What the tracker uses of Faust's consumer: ``_commit`` and its ack bookkeeping."""

    def __init__(self, result: Any) -> None:
        self.result = result
        self._acked: dict[TP, list[int]] = {}
        self._unacked_messages: set[Any] = set()

    async def _commit(self, offsets: dict[TP, int]) -> bool:
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


def test_commit_age_counts_only_commits_the_broker_confirmed() -> None:
    clock = Clock()
    consumer = FakeConsumer(result=False)  # Faust's _commit answers False when the commit failed
    tracker = CommitTracker(clock)
    tracker.track(consumer)
    consumer._acked[IN] = [41]  # offsets up to 41 processed: 42 waits for a commit
    clock.now += 5
    assert asyncio.run(consumer._commit({IN: 42})) is False
    assert tracker.age(consumer, frozenset({"p.in"})) == 5 and tracker.failures == 1
    consumer.result = RuntimeError("broker down")
    clock.now += 5
    try:
        asyncio.run(consumer._commit({IN: 42}))
    except RuntimeError:
        pass
    assert tracker.age(consumer, frozenset({"p.in"})) == 10 and tracker.failures == 2
    consumer.result = True
    assert asyncio.run(consumer._commit({IN: 42})) is True
    clock.now += 1
    assert tracker.committed == {IN: 42}
    assert tracker.age(consumer, frozenset({"p.in"})) == 0  # everything acknowledged is committed


def test_an_idle_worker_is_up_to_date_and_a_record_in_flight_is_not() -> None:
    clock = Clock()
    consumer = FakeConsumer(result=True)
    tracker = CommitTracker(clock)
    tracker.track(consumer)
    clock.now += 30
    assert tracker.age(consumer, frozenset({"p.in"})) == 0  # nothing processed, nothing to commit
    Message = namedtuple("Message", "tp offset")
    consumer._unacked_messages.add(Message(IN, 0))
    clock.now += 7
    assert tracker.age(consumer, frozenset({"p.in"})) == 7
    assert tracker.age(consumer, frozenset({"p.other"})) == 0  # only the input topics count


def test_watermark_cadence_keeps_the_highest_event_time_between_calls() -> None:
    clock = Clock()
    cadence = WatermarkCadence(0.25, clock)
    assert cadence.due(10.0) and cadence.event_time == 10.0
    clock.now += 0.1
    assert not cadence.due(12.0)
    clock.now += 0.1
    assert not cadence.due(11.0)
    clock.now += 0.1
    assert cadence.due(11.5) and cadence.event_time == 12.0


def test_a_partition_behind_the_others_holds_the_watermark_back() -> None:
    """Catching up, one partition's chunk is read ahead of another's: the watermark waits for the
    slower one, so its events are not late to windows the faster one would have closed."""
    clock = Clock()
    cadence = WatermarkCadence(0.25, clock, idle_s=2.0)
    assert cadence.due(100.0, ("audit", 0)) and cadence.event_time == 100.0
    clock.now += 0.3
    cadence.note(400.0, ("audit", 0))  # partition 0 is five minutes of event time ahead
    assert cadence.due(160.0, ("audit", 1)) and cadence.event_time == 160.0
    clock.now += 0.3
    assert cadence.due(390.0, ("audit", 1)) and cadence.event_time == 390.0


def test_partitions_with_records_to_read_are_waited_for_until_heard_or_idle() -> None:
    """A worker catching up gets one partition's first chunk (minutes of event time) before the others'."""
    clock = Clock()
    cadence = WatermarkCadence(0.25, clock, idle_s=2.0)
    cadence.expect([("audit", p) for p in range(3)])  # all three have records to read
    assert not cadence.due(400.0, ("audit", 0))  # partitions 1 and 2 not heard from yet
    clock.now += 0.5
    assert not cadence.due(120.0, ("audit", 1))
    clock.now += 0.5
    assert cadence.due(100.0, ("audit", 2)) and cadence.event_time == 100.0
    other = WatermarkCadence(0.25, clock, idle_s=2.0)
    other.expect([("audit", p) for p in range(3)])
    assert not other.due(400.0, ("audit", 0))
    clock.now += 2.5  # partitions 1 and 2 were revoked before they delivered: silent, so idle
    assert other.due(410.0, ("audit", 0)) and other.event_time == 410.0


def test_an_idle_partition_stops_holding_the_watermark_back_and_it_never_goes_back() -> None:
    clock = Clock()
    cadence = WatermarkCadence(0.25, clock, idle_s=2.0)
    cadence.note(50.0, ("feedback", 3))  # a sparse topic: one record, then silence
    assert cadence.due(60.0, ("audit", 0)) and cadence.event_time == 50.0
    clock.now += 1.0
    assert cadence.due(70.0, ("audit", 0)) and cadence.event_time == 50.0  # still heard from lately
    clock.now += 1.5
    assert cadence.due(80.0, ("audit", 0)) and cadence.event_time == 80.0  # silent for 2.5 s: idle
    clock.now += 0.5
    assert cadence.due(55.0, ("feedback", 3)) and cadence.event_time == 80.0  # back, but never backwards
    clock.now += 5.0  # everything idle: the newest event time anywhere
    assert cadence.due() and cadence.event_time == 80.0


def test_when_the_traffic_stops_event_time_goes_on_with_wall_time_once_caught_up() -> None:
    """The last window of a burst must close without the next request (which may come minutes
    later): silent past idle_s and caught up, the watermark moves with this worker's clock."""
    clock = Clock()
    cadence = WatermarkCadence(0.25, clock, idle_s=2.0)
    assert not cadence.idle()  # nothing heard yet: nothing to close
    cadence.note(80.0, ("fallbacks", 1))
    assert cadence.due(90.0, ("audit", 0)) and cadence.event_time == 80.0
    clock.now += 1.0
    assert not cadence.idle() and cadence.due(caught_up=True) and cadence.event_time == 80.0  # not silent yet
    clock.now += 4.0  # the audit partition heard 5 s ago, the fallbacks 5 s ago
    assert cadence.idle()
    assert cadence.due() and cadence.event_time == 90.0  # not known to be caught up: the newest event time only
    clock.now += 1.0
    assert cadence.due(caught_up=True) and cadence.event_time == 90.0 + 6.0 - 2.0
    clock.now += 60.0
    assert cadence.due(caught_up=True) and cadence.event_time == 90.0 + 66.0 - 2.0
    clock.now += 1.0  # a broker outage: not caught up, so it stays; and never goes back
    assert cadence.due() and cadence.event_time == 154.0
    assert cadence.due(100.0, ("audit", 0)) is False  # within interval_s of the last call
    clock.now += 0.5
    assert not cadence.idle() and cadence.due(caught_up=True) and cadence.event_time == 154.0


class EndOffsets:
    """What ``StreamsApp._caught_up`` uses of Faust's consumer."""

    def __init__(self, assigned: list[TP], ends: dict[TP, int] | Exception, committed: dict[TP, int]) -> None:
        self.assigned, self.ends, self._committed_offset = assigned, ends, committed

    def assignment(self) -> set[TP]:
        return set(self.assigned)

    async def highwaters(self, *tps: TP) -> dict[TP, int]:
        if isinstance(self.ends, Exception):
            raise self.ends
        return {tp: self.ends[tp] for tp in tps}


def caught_up(consumer: EndOffsets, topics: set[str]) -> bool:
    streams = object.__new__(StreamsApp)  # only the attributes _caught_up reads
    streams.config = StreamsConfig(bootstrap="unused", topic_prefix="p.")
    streams.commits = CommitTracker()
    streams.app = type("App", (), {"consumer": consumer})()
    return asyncio.run(streams._caught_up(topics))


def test_idle_windows_close_only_when_the_broker_says_everything_was_read() -> None:
    """The timer's check before event time may move with the clock (``WatermarkCadence``): a
    broker outage or a rebalance must not count as the traffic having stopped, or the records the
    serving nodes buffered meanwhile would come late to windows already closed."""
    other = TP("p.other", 0)
    assigned = [IN, TP("p.in", 1), other]
    committed = {IN: 40, TP("p.in", 1): 7, other: 0}
    assert caught_up(EndOffsets(assigned, {IN: 40, TP("p.in", 1): 7, other: 99}, committed), {"in"})
    assert not caught_up(EndOffsets(assigned, {IN: 41, TP("p.in", 1): 7, other: 0}, committed), {"in"})
    assert not caught_up(EndOffsets(assigned, ConnectionError("broker down"), committed), {"in"})
    assert not caught_up(EndOffsets([other], {other: 0}, committed), {"in"})  # none assigned: a rebalance


class Store(dict):  # type: ignore[type-arg]
    def apply_changelog_batch(self, batch: list[tuple[bytes, bytes]]) -> None:
        self.update(batch)


class Table:
    def __init__(self) -> None:
        self.data = Store()
        self.changelog: list[tuple[int, bytes, bytes | None]] = []

    def send_changelog(self, partition: int, key: bytes, value: bytes | None, **_: Any) -> None:
        self.changelog.append((partition, key, value))


def text_state(table: Table) -> TableState[str]:
    return TableState(table, TableStateSpec("t", str.encode, bytes.decode))


def test_a_key_written_many_times_in_a_batch_is_one_changelog_record() -> None:
    table = Table()
    state = text_state(table)
    state.partition = 2
    for value in ("a", "b", "c"):
        state["k"] = value
    state["gone"] = "x"
    del state["gone"]
    assert dict(state.items()) == {"k": "c"} and len(state) == 1
    assert state.seal() == 2
    assert state.drain(unsealed=False) == [(2, b"k", b"c"), (2, b"gone", None)]
    assert table.data == {b"k": b"c"} and state["k"] == "c"


def test_unsealed_writes_wait_for_their_batch_and_recovery_refreshes_the_view() -> None:
    table = Table()
    state = text_state(table)
    state.partition = 0
    state["a"] = "1"
    assert state.drain(unsealed=False) == []  # another thread's batch: not sealed yet
    assert state.flush() == 1 and table.changelog == [(0, b"a", b"1")]
    table.data.apply_changelog_batch([(b"b", b"2")])  # Faust recovering the changelog
    assert dict(state.items()) == {"a": "1", "b": "2"} and "b" in state


HOUR = 3600.0


def _audits(stamper: NodeStamper, first: int, n: int, at: float) -> list[Audit]:
    return [Audit(**stamper.stamp(at), request_id=f"req-{i}", audit_id=f"audit-{i}", model="m", prompt="q",
                  response="a") for i in range(first, first + n)]


def test_the_worker_cadence_moves_event_time_only_as_far_as_its_own_clock() -> None:
    clock, wall = Clock(), Clock()
    wall.now = 1_800_000_000.0
    cadence = WatermarkCadence(0.25, clock, idle_s=2.0, wall=wall)
    assert cadence.due(wall.now - 5, ("audit", 0)) and cadence.event_time == wall.now - 5
    clock.now += 0.3
    assert cadence.due(wall.now + HOUR, ("audit", 0))  # a node an hour fast
    assert cadence.event_time == wall.now + MAX_AHEAD_OF_CLOCK_S
    # Traffic stops, caught up: event time goes on with wall time from the capped time, not from
    # an hour ahead (the idle rule takes the newest time heard, so it was the worst case).
    clock.now += 10.0
    wall.now += 10.0
    assert cadence.due(caught_up=True)
    assert cadence.event_time == pytest.approx(wall.now - 10.0 + MAX_AHEAD_OF_CLOCK_S + 10.0 - 2.0)
    assert cadence.event_time < wall.now + MAX_AHEAD_OF_CLOCK_S


def test_the_worker_counts_records_ahead_of_its_clock_and_names_the_node_once_a_minute(caplog) -> None:
    streams = object.__new__(StreamsApp)  # only the attributes _count_ahead uses
    streams.events_ahead, streams._ahead_logged_at = 0, float("-inf")
    now = time.time()
    records = [*_audits(NodeStamper("node-on-time"), 0, 3, now), *_audits(NodeStamper("node-fast-clock"), 3, 2, now + HOUR)]
    with caplog.at_level("WARNING", logger="entroloop.streams.app"):
        streams._count_ahead("entroloop.audit.v1", records, event_time_ceiling(now))
        streams._count_ahead("entroloop.audit.v1", records, event_time_ceiling(now))
    assert streams.events_ahead == 4  # the fast node's 2 audits, in both batches
    warnings = [r.getMessage() for r in caplog.records if "ahead of this worker's clock" in r.getMessage()]
    assert len(warnings) == 1 and "node-fast-clock" in warnings[0] and "by up to 3600 s" in warnings[0]


def test_an_aggregating_processor_in_a_group_of_several_workers_is_reported_not_silent(caplog) -> None:
    """Topics are keyed by request id: a worker that holds some partitions sees some requests. The
    aggregating processors (fallback rates, rule counts, retrain triggers) then count a share under
    the same window ids as the other workers': the worker says so (Health and a logged error)."""
    from entroloop.streams.defaults import default_processors

    from entroloop.contract.settings import Settings

    streams = object.__new__(StreamsApp)  # only the attributes the check reads
    streams.config = StreamsConfig(bootstrap="unused", topic_prefix="p.", partitions=6)
    streams.processors = default_processors(Settings(), with_intent=False)
    streams._partial_logged_at = float("-inf")
    streams.app = type("App", (), {"conf": type("Conf", (), {"id": "entroloop-streams"})()})()
    topics = {"entroloop.audit.v1", "entroloop.fallbacks.v1", "entroloop.badcases.v1", "entroloop.tokens.v1",
              "entroloop.feedback.v1"}
    everything = [TP(f"p.{t}", n) for t in topics for n in range(6)]
    assert set(streams.partitions_not_held(everything).values()) == {0}
    assert set(streams.partitions_not_held(everything)) == {"fallback_rates", "response_rules", "retrain_triggers"}
    assert streams.partitions_not_held([]) == {}  # nothing assigned (a rebalance): nothing to say yet
    half = [tp for tp in everything if tp.partition < 3]
    missing = streams.partitions_not_held(half)
    assert missing == {"fallback_rates": 6, "response_rules": 3, "retrain_triggers": 6}  # 3 per input topic
    with caplog.at_level("ERROR", logger="entroloop.streams.app"):
        streams._warn_partial_aggregates(missing)
        streams._warn_partial_aggregates(missing)  # at most once a minute
        streams._warn_partial_aggregates(streams.partitions_not_held(everything))
    errors = [r.getMessage() for r in caplog.records if "--role aggregates" in r.getMessage()]
    assert len(errors) == 1 and "fallback_rates" in errors[0] and "entroloop-streams" in errors[0]


def test_the_partition_count_comes_from_the_broker_when_it_knows_it() -> None:
    from entroloop.streams.defaults import default_processors

    from entroloop.contract.settings import Settings

    streams = object.__new__(StreamsApp)
    streams.config = StreamsConfig(bootstrap="unused", topic_prefix="p.", partitions=6)
    streams.processors = default_processors(Settings(), with_intent=False)
    audits = [TP("p.entroloop.audit.v1", n) for n in range(6)]
    # topics created with 12 partitions elsewhere: 6 held are half of them
    assert streams.partitions_not_held(audits, lambda topic: 12)["response_rules"] == 6
    assert streams.partitions_not_held(audits, lambda topic: None)["response_rules"] == 0
    # a worker that holds none of the aggregating inputs (only tokens) has nothing to report
    assert streams.partitions_not_held([TP("p.entroloop.tokens.v1", 0)]) == {}


def _snapshot_streams(limit: int) -> tuple[StreamsApp, list[tuple[str, bytes, bytes, int | None]]]:
    """A StreamsApp with only what ``_send_snapshot`` reads, its produced records collected."""
    streams = object.__new__(StreamsApp)
    streams.app = type("App", (), {"conf": type("Conf", (), {"producer_max_request_size": limit})()})()
    streams.counts = {"snapshots": 0}
    streams._locks = {}
    streams._watermarks = defaultdict(WatermarkCadence)
    produced: list[tuple[str, bytes, bytes, int | None]] = []
    ticks = iter([3])  # the first hand-over waits longest (metadata, a full buffer), later ones not

    async def produce(records: list) -> None:
        for _ in range(next(ticks, 0) + 1):
            await asyncio.sleep(0)  # a hand-over that yields, as aiokafka's does
        produced.extend(records)

    streams._produce = produce
    return streams, produced


def _keeper(streams: StreamsApp, processor: Any) -> Any:
    from contextlib import nullcontext

    from entroloop.streams.aggregate_snapshots import SnapshotKeeper

    table = type("Table", (), {"data": {}, "changelog_topic": type("T", (), {"get_topic_name": lambda self: "p.snap"})()})()
    keeper = SnapshotKeeper(processor, table)
    streams._locks[id(processor)] = nullcontext()
    return keeper


def test_snapshots_reach_the_producer_in_the_order_they_were_taken_and_only_when_changed() -> None:
    """Two agents (audits, fallbacks) finish batches of one aggregating processor at once: the newest
    snapshot must be the changelog's last record, so each is taken and handed over in turn."""
    import msgspec
    from entroloop.streams.aggregate_snapshots import KEY, PARTITION, CoveredState
    from entroloop.streams.fallback_rates import FallbackRateMonitor

    streams, produced = _snapshot_streams(limit=1 << 20)
    keeper = _keeper(streams, FallbackRateMonitor())
    Message = namedtuple("Message", "topic partition offset")

    async def batch(topic: str, offset: int) -> None:
        keeper.cover([(None, Message(topic, 0, offset))])
        await streams._send_snapshot(keeper)

    async def main() -> None:
        await streams._send_snapshot(keeper)  # nothing processed: nothing written
        assert produced == []
        await asyncio.gather(batch("p.audit", 5), batch("p.fallbacks", 9))

    asyncio.run(main())
    assert [(topic, key, partition) for topic, key, _, partition in produced] == [("p.snap", KEY, PARTITION)] * len(produced)
    offsets = [msgspec.msgpack.decode(raw, type=CoveredState).offsets for _, _, raw, _ in produced]
    assert offsets[-1] == {"p.audit:0": 5, "p.fallbacks:0": 9}  # the last one written covers both batches
    assert all(set(a.items()) <= set(b.items()) for a, b in itertools.pairwise(offsets))  # never older
    assert streams.counts["snapshots"] == len(produced)


def test_a_snapshot_over_the_request_size_is_not_written_and_is_reported(caplog) -> None:
    """The broker would refuse it, and a refused delivery stops the worker's commits for good."""
    from entroloop.streams.retrain_triggers import RetrainTrigger

    streams, produced = _snapshot_streams(limit=2048)
    trigger = RetrainTrigger()
    trigger.seen_bad_cases = {2**63 + i: 1e9 for i in range(400)}  # ~3.6 KB of counted fingerprints
    keeper = _keeper(streams, trigger)
    keeper.cover([(None, namedtuple("Message", "topic partition offset")("p.badcases", 0, 1))])
    with caplog.at_level("ERROR", logger="entroloop.streams.app"):
        asyncio.run(streams._send_snapshot(keeper))
    assert produced == [] and keeper.unwritten == 1 and keeper.last_bytes > 2048
    assert "over the producer's request size" in caplog.text


def test_a_worker_no_record_reaches_restores_its_snapshot_and_event_time_from_the_idle_timer() -> None:
    """Restarted into silence, no batch restores the aggregating processors' state: the idle timer
    does, once the broker says nothing is left to read, and starts their event time from the
    snapshot's, so the restored windows can close."""
    from entroloop.streams.aggregate_snapshots import SnapshotKeeper
    from entroloop.streams.fallback_rates import FallbackRateMonitor

    from .analytics_records import audit

    table = type("Table", (), {"data": {}})()
    writer = FallbackRateMonitor()
    writer.process_batch([audit(f"r{i}", at=6000.0 + i) for i in range(5)])
    SnapshotKeeper(writer, table).take(event_time=6004.0)

    streams, _ = _snapshot_streams(limit=1 << 20)
    idle, busy = FallbackRateMonitor(), FallbackRateMonitor()
    streams.processors = [idle, busy]
    streams.snapshots = {id(idle): _keeper(streams, idle), id(busy): _keeper(streams, busy)}
    streams.snapshots[id(idle)].table = table
    streams.snapshots[id(busy)].table = table
    streams._watermarks[id(busy)].note(7000.0, ("audit", 0))  # a batch came: its restore is the batch's
    caught_up = [False]

    async def answer(topics: set[str]) -> bool:
        return caught_up[0]

    streams._caught_up = answer
    streams._input_names = lambda processor: {"audit"}
    asyncio.run(streams._restore_into_silence())  # records still to read: the first batch restores
    assert not streams.snapshots[id(idle)].restored and not streams._watermarks[id(idle)].started
    caught_up[0] = True
    asyncio.run(streams._restore_into_silence())
    assert streams.snapshots[id(idle)].restored and idle.snapshot() == writer.snapshot()
    assert streams._watermarks[id(idle)].newest_heard == 6004.0
    assert not streams.snapshots[id(busy)].restored
    asyncio.run(streams._restore_into_silence())  # once: a later tick does not note the old event time again
    assert streams._watermarks[id(idle)].newest_heard == 6004.0


def test_a_restored_event_time_lets_silence_close_windows_and_never_holds_later_records_back() -> None:
    """``resume`` (a worker restarted into silence): a source already silent. Noted as an ordinary
    source it held the watermark at the restored time for ``idle_s`` once traffic came back: with
    an hour of ``idle_s`` the restored minute never closed (CI, the mid-minute restart test)."""
    clock = Clock()
    clock.now = 1_000.0
    cadence = WatermarkCadence(0.25, clock, idle_s=3600.0, wall=lambda: 2e9)
    cadence.resume(6059.0)
    assert cadence.started and cadence.idle()
    clock.now += 10.0
    assert cadence.due(caught_up=True) and 6059.0 < cadence.event_time <= 6069.01  # silence moves it on

    traffic = WatermarkCadence(0.25, clock, idle_s=3600.0, wall=lambda: 2e9)
    traffic.resume(6059.0)
    clock.now += 1.0
    assert traffic.due(6180.0, ("audit", 0)) and traffic.event_time == 6180.0  # not held at 6059
