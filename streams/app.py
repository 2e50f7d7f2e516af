"""The Faust adapter: the same ``Processor`` objects as the embedded runner, wired to Kafka topics.

One agent per input topic. Each agent reads raw bytes (``value_serializer="raw"``), decodes them
with ``entroloop.contract.codec`` (a poison record becomes a ``DeadLetter`` with the reason, never an
exception in the loop), hands the records to every processor subscribed to their type and sends
what they return to the records' topics, keyed by ``request_id``. Processors run on the event loop
itself, a batch at a time (tens of milliseconds); one that declares ``blocking`` (the intent
scorer's embedding model) runs in the agent's one-thread executor, so it does not stall the loop
and its state is only ever touched by that thread. Running the fast ones on a thread too cost
more than they do: a hand-off per batch and the GIL passed back and forth with the loop.

Delivery is at-least-once (``processing_guarantee="at_least_once"``; Faust's exactly-once mode has
open loss and duplication bugs, see DESIGN.md). An input offset is acknowledged only after the
processor ran and its outputs were handed to the producer, and Faust flushes the producer before
every offset commit, so a crash re-processes instead of losing; derived records carry
deterministic ids (``entroloop.streams.base.derive``), so the sinks absorb the repeats. A flush can
end in a refusal, after which Faust would commit anyway: ``entroloop.streams.faust_delivery`` then
commits nothing more and stops the worker, and an output no broker would take (over the producer's
request size) is replaced by a dead letter before it is sent.

Guard against faust-streaming issue 606: with ``concurrency > 1`` Faust can commit an offset past
an event that is still being processed (``Consumer._new_offset`` treats a one-offset hole at the
committed head as a compaction gap), and a crash then loses that event. Each agent therefore runs
exactly one actor, which processes its topic's events in offset order per partition, so an event
is never acknowledged before an earlier one of the same partition. ``build_streams_app`` refuses
``concurrency != 1`` unless the caller explicitly accepts it (only a test does). The strict commit
of ``entroloop.streams.faust_offsets`` now closes that loss as well; one actor stays the rule because the
processors rely on per-partition order (chunk carry, bad-case join). Scale with partitions and
more worker processes instead.

Faust's offset bookkeeping is guarded for the input topics (``entroloop.streams.faust_offsets``): after a
rebalance its fetch loop could take stale prefetched records for a compaction gap and commit past
records no processor saw; guarded, a record may be processed twice but is never skipped.

Durable state: a processor that declares ``table_state`` (``entroloop.streams.table_state.TableStateSpec``;
the bad-case join does) gets a Faust table with a compacted changelog as its ``state``, co-
partitioned with its input topics (all keyed by ``request_id``, same partition count), so a
restarted worker recovers the state from the broker (each key's changelog partition is its
record's: one call per batch when the spec names the key a record writes, ``key_of``, else one
call per input partition). Its writes are buffered while the batch runs,
encoded once per key at the end of the batch, and applied to the table on the event loop,
their changelog records (one per key per batch) handed to the producer before the batch is
acknowledged, after the batch's outputs. The changelog can still reach the broker while an output
does not (another partition on another broker, or a refused delivery, after which the worker stops
and its inputs are replayed): so a processor with durable state makes its outputs again when it is
handed the same inputs again (the bad-case join re-makes the bad cases of a joined request; the
entropy carry re-judges a chunk), under the same event ids, which the sinks absorb.

Counts over many requests (a processor that implements ``snapshot``: the aggregating ones) are kept
otherwise, since a count is not idempotent: after each batch that reached it, one changelog record
holds its whole state and the input offsets that state covers, and a restarted worker restores it
and skips what it covers (``entroloop.streams.aggregate_snapshots``).

Cost per event (``entroloop bench workers``): outputs and changelog records go straight to the
producer, one aiokafka batch per topic partition (``_produce``: no future per record; lingering
``producer_linger_s`` to gather them), not through ``Topic.send`` and its per-message futures and
sensors; ``on_watermark`` runs at most every ``watermark_interval_s`` per processor
(``WatermarkCadence``); Faust's per-record statistics and codec calls are trimmed
(``faust_monitor``, ``faust_raw``) and its fetch loop's hand-over is run inline (``faust_drain``).

Health: every ``health_interval`` seconds each worker publishes ``Health`` records with the
consumer lag (log end offset minus committed offset) per assigned partition and the age of the
last successful offset commit, taken from the commit call itself (``CommitTracker``; 0 while
nothing processed waits for a commit).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import os
import socket
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, aclosing, nullcontext
from dataclasses import dataclass, field
from typing import Any

import faust
from entroloop.streams.aggregate_snapshots import KEY as SNAPSHOT_KEY
from entroloop.streams.aggregate_snapshots import PARTITION as SNAPSHOT_PARTITION
from entroloop.streams.aggregate_snapshots import SnapshotKeeper, keeps_snapshots
from entroloop.streams.base import Processor, derive
from entroloop.streams.faust_batches import finish_before_cancel
from entroloop.streams.faust_delivery import DeliveryGuard
from entroloop.streams.faust_drain import install_lean_drain
from entroloop.streams.faust_fetch import shorten_fetch_wait
from entroloop.streams.faust_monitor import LeanMonitor
from entroloop.streams.faust_offsets import (
    REDELIVER_AFTER_S,
    guard_consumer_offsets,
    stalled_partition_check,
)
from entroloop.streams.faust_raw import RawBytesSchema
from entroloop.streams.faust_recovery_watch import watch_recovery
from entroloop.streams.faust_take import take_batches
from entroloop.streams.stop_watchdog import arm_stop_watchdog
from entroloop.streams.table_state import TableState, TableStateSpec
from entroloop.streams.windowing import MAX_AHEAD_OF_CLOCK_S, event_time_ceiling

from entroloop.contract.codec import (
    CodecError,
    RecordTooLarge,
    dead_letter_at,
    decode_many,
    encode,
    failure_fields,
)
from entroloop.contract.ids import NodeStamper
from entroloop.contract.records import DeadLetter, Event, Health
from entroloop.contract.settings import Settings
from entroloop.contract.topics import TOPIC_BY_NAME, TOPIC_BY_TYPE
from entroloop.infra.gc_policy import tune_for_streaming
from entroloop.infra.metrics import (
    CONSUMER_LAG,
    DEAD_LETTERS,
    EVENTS_AHEAD,
    EVENTS_IN,
    EVENTS_OUT,
    LAST_COMMIT,
    LATE_EVENTS,
    TABLE_ENTRIES,
    TABLE_EVICTED,
)

log = logging.getLogger(__name__)

ISSUE_606 = "https://github.com/faust-streaming/faust/issues/606"


class UnsafeConcurrency(ValueError):
    """Agent concurrency above 1 can commit past an in-flight event (faust-streaming issue 606)."""


@dataclass
class StreamsConfig:
    bootstrap: str
    topic_prefix: str = ""
    app_id: str = "entroloop-streams"
    partitions: int = 6
    batch_size: int = 2000
    """Most records handed to a processor at once (``stream.take_events``)."""
    batch_within_s: float = 0.2
    buffer_records: int = 32_768
    """Records fetched ahead per input topic (Faust's ``stream_buffer_maxsize``, default 4,096:
    with it the worker spent a fifth of its time waiting on fetches in ``entroloop bench workers``)."""
    watermark_interval_s: float = 0.25
    """Most often a processor's ``on_watermark`` runs (``WatermarkCadence``)."""
    watermark_idle_s: float = 2.0
    """An input partition silent this long stops holding the watermark back (``WatermarkCadence``)."""
    producer_linger_s: float = 0.02
    commit_interval_s: float = 1.0
    health_interval_s: float = 10.0
    stop_grace_s: float = 30.0
    """How long a stopping worker may take before ``entroloop.streams.stop_watchdog`` exits it (code 70)."""
    max_record_bytes: int = 1 << 20
    concurrency: int = 1
    allow_unsafe_concurrency: bool = False
    """Only for the test that proves the issue-606 guard: accept concurrency > 1 and its loss."""
    node_id: str = field(default_factory=lambda: f"streams@{socket.gethostname()}:{os.getpid()}")
    datadir: str = ""
    """Faust's data folder; empty: a folder under /tmp named by the process id."""
    faust_options: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> StreamsConfig:
        if not settings.kafka_bootstrap:
            raise ValueError("ENTROLOOP_KAFKA_BOOTSTRAP is empty: the Faust worker needs a Kafka broker")
        values: dict[str, Any] = {
            "bootstrap": settings.kafka_bootstrap,
            "topic_prefix": settings.topic_prefix,
            "partitions": settings.partitions,
            "max_record_bytes": settings.max_record_bytes,
            "batch_size": settings.streams_batch_size,
            "buffer_records": settings.streams_buffer_records,
            "commit_interval_s": settings.streams_commit_interval_s,
            "health_interval_s": settings.streams_health_interval_s,
            "watermark_idle_s": settings.streams_watermark_idle_s,
            "stop_grace_s": settings.streams_stop_grace_s,
            "datadir": str(settings.data_dir / "faust"),
            "faust_options": {
                "broker_session_timeout": settings.streams_session_timeout_s,
                "broker_heartbeat_interval": min(3.0, settings.streams_session_timeout_s / 6),
            },
        }
        values.update(overrides)
        return cls(**values)


RESTORED = ("restored", -1)
"""The source of an event time restored from a snapshot (``WatermarkCadence.resume``)."""


class WatermarkCadence:
    """When to call a processor's ``on_watermark``, and with which event time.

    The watermark is the lowest of the input partitions' newest event times, over the partitions
    heard from in the last ``idle_s`` of wall time (all of them when every one is idle), and never
    goes back. The newest event time seen anywhere was the rule, but a worker catching up on a
    backlog reads one partition's chunk ahead of another's: the watermark then ran past the slower
    partition's events, which came late to windows that had closed (dropped, counted as late) and
    to joins that had expired them. A partition silent for ``idle_s`` (no traffic, or revoked) stops
    holding the others back, as in Flink's idleness. ``source`` is the ``(topic, partition)`` the
    event times came from; one caller without partitions passes none. ``expect``: partitions known
    to hold records not yet read (a catching-up worker gets one partition's first chunk before the
    others'), waited for from then on until heard from or silent for ``idle_s``.

    Calls come at most every ``interval_s`` of wall time: per batch was the rule, but an expiry
    scan (the bad-case join scans its whole table) then runs for every small batch of every input
    topic; windows close at most ``interval_s`` later, which their grace periods (seconds) dwarf.

    When the traffic stops, no later event comes to close the last windows: their alerts waited
    for the next request, minutes on a quiet deployment. So when every partition has been silent
    for ``idle_s`` and the caller has checked with the broker that nothing is left to read
    (``due(caught_up=True)``), event time is taken to pass with wall time from the newest event
    heard, less ``idle_s``. Durations on this worker's clock, never its time of day, so a serving
    node's clock skew does not move it; a worker that cannot read (broker down, stuck) is not
    caught up, so records buffered meanwhile are not made late."""

    def __init__(self, interval_s: float = 0.25, clock: Callable[[], float] = time.monotonic,
                 idle_s: float = 2.0, wall: Callable[[], float] = time.time) -> None:
        self.interval_s = interval_s
        self.idle_s = idle_s
        self.clock = clock
        self.wall = wall  # time of day: only to cap event time (``event_time_ceiling``)
        self.event_time = float("-inf")
        self._last_call = float("-inf")
        self._newest: dict[Any, tuple[float, float]] = {}  # source -> (newest event time, wall time heard)

    @property
    def started(self) -> bool:
        return bool(self._newest)

    @property
    def newest_heard(self) -> float:
        """The newest event time any source delivered (-inf before the first)."""
        return max((t for t, _ in self._newest.values()), default=float("-inf"))

    def expect(self, sources: Iterable[Any]) -> None:
        """Wait for ``sources`` (partitions with records not yet read) not heard from yet."""
        now = self.clock()
        for source in sources:
            self._newest.setdefault(source, (float("-inf"), now))

    def resume(self, event_time: float) -> None:
        """Start from ``event_time`` restored from a snapshot (a worker restarted into silence): as
        a source already silent for ``idle_s``, so it never holds the watermark back (records that
        come later move it as usual) and only lets silence move event time on from there."""
        event_time = min(event_time, event_time_ceiling(self.wall()))
        self._newest.setdefault(RESTORED, (event_time, self.clock() - self.idle_s - 1e-3))

    def note(self, event_time: float, source: Any = None) -> None:
        """Record that ``source`` delivered events up to ``event_time``, taken as no later than this
        reader's clock allows (``entroloop.streams.windowing.MAX_AHEAD_OF_CLOCK_S``: a producer's
        wrong clock must not close windows early)."""
        event_time = min(event_time, event_time_ceiling(self.wall()))
        now = self.clock()
        newest, _ = self._newest.get(source, (float("-inf"), now))
        self._newest[source] = (max(newest, event_time), now)

    def idle(self) -> bool:
        """True when events came once and every source has been silent for ``idle_s`` since."""
        now = self.clock()
        return self.started and all(now - heard > self.idle_s for _, heard in self._newest.values())

    def due(self, event_time: float | None = None, source: Any = None, caught_up: bool = False) -> bool:
        """Record ``event_time`` from ``source`` (if given); True when ``on_watermark(self.event_time)``
        should run now. ``caught_up``: the caller checked that no record is left to read."""
        if event_time is not None:
            self.note(event_time, source)
        now = self.clock()
        if not self._newest or now - self._last_call < self.interval_s:
            return False
        active = [t for t, heard in self._newest.values() if now - heard <= self.idle_s]
        if active:
            newest = min(active)
        elif caught_up:  # the traffic stopped: event time goes on with wall time (see the class doc)
            newest = max(t + (now - heard) - self.idle_s for t, heard in self._newest.values())
        else:
            newest = max(t for t, _ in self._newest.values())
        candidate = max(self.event_time, newest)
        if candidate == float("-inf"):  # still waiting to hear from every partition
            return False
        self._last_call, self.event_time = now, candidate
        return True


class CommitTracker:
    """When the worker's offsets were last known committed, from the commit call itself.

    ``track`` wraps the consumer's ``_commit`` (the call that commits to the broker and says whether
    it did): Faust's sensor hook is the wrong source, because faust-streaming 0.15.3 calls
    ``app.monitor.on_tp_commit`` (not the sensors) and calls it even when the commit failed. The
    age is "how long has work been waiting for a commit": it is 0 while nothing processed is
    uncommitted (an idle worker is not a stuck one), and grows while commits fail or no record
    gets acknowledged.
    """

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self.committed: dict[Any, int] = {}
        """The offsets the broker confirmed, per partition."""
        self.last_commit_at: float = clock()
        self.failures = 0

    def track(self, consumer: Any) -> None:
        """Install on a Faust consumer (before it starts)."""
        faust_commit = consumer._commit

        async def commit(offsets: Any) -> bool:
            try:
                done = await faust_commit(offsets)
            except BaseException:
                self.failures += 1
                raise
            if done:
                self.on_commit(offsets)
            else:
                self.failures += 1
            return bool(done)

        consumer._commit = commit

    def on_commit(self, offsets: Any) -> None:
        self.committed.update(offsets)
        self.last_commit_at = self.clock()

    def age(self, consumer: Any, topics: frozenset[str]) -> float:
        """Seconds since the last commit, or 0 when every acknowledged offset of ``topics`` is
        committed and no record is in flight (then "up to date" restarts the clock)."""
        now = self.clock()
        waiting = any(m.tp.topic in topics for m in list(getattr(consumer, "_unacked_messages", ())))
        if not waiting:
            for tp, acked in list(getattr(consumer, "_acked", {}).items()):
                if tp.topic in topics and acked and max(acked) + 1 > self.committed.get(tp, -1):
                    waiting = True
                    break
        if not waiting:
            self.last_commit_at = now
        return now - self.last_commit_at


class StreamsApp:
    """A Faust app running ``processors``; ``app`` is the ``faust.App`` (``app.main()`` runs a worker)."""

    def __init__(self, config: StreamsConfig, processors: Sequence[Processor]) -> None:
        if config.concurrency != 1 and not config.allow_unsafe_concurrency:
            raise UnsafeConcurrency(
                f"agent concurrency {config.concurrency} can commit an offset past an event still in "
                f"flight and lose it on a crash ({ISSUE_606}); run more worker processes instead"
            )
        self.config = config
        self.processors = list(processors)
        self.stamper = NodeStamper(config.node_id)
        self.commits = CommitTracker()
        self.counts: dict[str, int] = defaultdict(int)
        datadir = os.environ.get("ENTROLOOP_FAUST_DATADIR") or config.datadir or f"/tmp/entroloop-faust-{os.getpid()}"
        os.makedirs(datadir, exist_ok=True)
        self.app = faust.App(
            config.topic_prefix + config.app_id,
            broker=f"kafka://{config.bootstrap}",
            value_serializer="raw",
            key_serializer="raw",
            processing_guarantee="at_least_once",
            store="memory://",
            web_enabled=False,
            topic_partitions=config.partitions,
            topic_allow_declare=False,
            consumer_auto_offset_reset="earliest",
            broker_commit_interval=config.commit_interval_s,
            producer_acks=-1,
            # No standby copies: the memory store keeps a standby partition's keys in the same
            # mapping as the active ones, so a worker's processors would read, expire and emit for
            # keys another worker owns (early "incomplete request" dead letters, tombstones written
            # into the owner's changelog partitions). A partition that moves is recovered from its
            # compacted changelog instead; the state is TTL-bounded, so that is seconds.
            table_standby_replicas=0,
            # Outputs and changelog writes go out in batches, not one produce request each: a few
            # ms of latency for a fraction of the per-record requests (the worker's main cost).
            producer_linger=config.producer_linger_s,
            producer_max_batch_size=1 << 20,
            stream_buffer_maxsize=config.buffer_records,
            # Faust keeps little here (in-memory tables), but it must not litter the working folder.
            datadir=datadir,
            # Faust's per-record statistics feed only its web UI (off): entroloop.streams.faust_monitor.
            Monitor=LeanMonitor,
            **config.faust_options,
        )
        self.commits.track(self.app.consumer)
        # Durable state: a processor with ``table_state`` gets a Faust table (changelogged, so a
        # restarted worker recovers it) as its ``state``. A processor fed by two topics (the
        # bad-case join: audit and feedback) runs on two agents' threads: a lock per such processor
        # keeps its read-modify-write of one key whole (single-topic processors need none, and
        # stay unlocked so the issue-606 control can still run two actors side by side).
        self._locks: dict[int, AbstractContextManager[Any]] = {
            id(p): threading.Lock() if len({TOPIC_BY_TYPE[t].name for t in p.inputs}) > 1 else nullcontext()
            for p in self.processors
        }
        self.table_states: dict[int, TableState[Any]] = {}
        self.snapshots: dict[int, SnapshotKeeper] = {}
        self._counted: dict[tuple[str, int], int] = {}  # (metric, processor): its running total already counted
        self.events_ahead = 0  # records ahead of this worker's clock (``_count_ahead``)
        self.recovery_refetches = 0  # changelog partitions a stalled table recovery fetched again
        self._ahead_logged_at = float("-inf")
        self._partial_logged_at = float("-inf")  # last error about aggregates counted by several workers
        self._watermarks = {id(p): WatermarkCadence(config.watermark_interval_s, idle_s=config.watermark_idle_s)
                            for p in self.processors}
        for processor in self.processors:
            spec: TableStateSpec[Any] | None = getattr(processor, "table_state", None)
            if spec is not None:
                table = self.app.Table(
                    spec.name,
                    partitions=config.partitions,
                    key_type=bytes,  # bytes types: the raw codec, values are ``spec.encode`` bytes
                    value_type=bytes,
                )
                state: TableState[Any] = TableState(table, spec)
                processor.state = state  # type: ignore[attr-defined]
                self.table_states[id(processor)] = state
            if keeps_snapshots(processor):  # exact counts across a crash (entroloop.streams.aggregate_snapshots)
                table = self.app.Table(f"{processor.name}-snapshot", partitions=config.partitions,
                                       key_type=bytes, value_type=bytes)
                self.snapshots[id(processor)] = SnapshotKeeper(processor, table)
        self._faust_topics: dict[str, Any] = {}  # prefixed name -> Faust topic (the agents read them)
        self._executors: dict[int, concurrent.futures.Executor] = {}  # blocking processor -> its agent's thread
        self._routes: dict[type[Event], list[Processor]] = defaultdict(list)
        for processor in self.processors:
            for record_type in processor.inputs:
                self._routes[record_type].append(processor)
        self.input_topics = sorted({TOPIC_BY_TYPE[t].name for t in self._routes})
        for name in self.input_topics:
            self._add_agent(name)
        # Faust's rebalance race can commit past records never processed (entroloop.streams.faust_offsets).
        self._guarded_topics = frozenset(config.topic_prefix + name for name in self.input_topics)
        guard_consumer_offsets(self.app.consumer, self._guarded_topics)
        # ... and commits nothing past an output batch the broker refused (entroloop.streams.faust_delivery).
        self.deliveries = DeliveryGuard()
        self.deliveries.guard_commit(self.app.consumer, self.app.crash)
        stalled = stalled_partition_check(self.app.consumer, self._guarded_topics)

        async def seek_back_stalled_partitions() -> None:
            stalled()

        self.app.timer(REDELIVER_AFTER_S / 2)(seek_back_stalled_partitions)
        install_lean_drain(self.app.consumer)  # no generator step and no four tasks per fetched record (entroloop.streams.faust_drain)
        shorten_fetch_wait(self.app.consumer)  # no 1.5 s long poll holding busy partitions (entroloop.streams.faust_fetch)
        self.app.timer(config.health_interval_s)(self._publish_health)
        self.app.timer(config.watermark_idle_s / 2)(self._close_windows_when_idle)

    # --- wiring --------------------------------------------------------------------------------
    def _topic(self, name: str) -> Any:
        full = self.config.topic_prefix + name
        if full not in self._faust_topics:
            # bytes as fetched, without Faust's codec registry per record (entroloop.streams.faust_raw)
            self._faust_topics[full] = self.app.topic(full, schema=RawBytesSchema())
        return self._faust_topics[full]

    def _add_agent(self, topic_name: str) -> None:
        source = self._topic(topic_name)
        record_type = TOPIC_BY_NAME[topic_name].record_type
        processors = self._routes[record_type]
        inline = [p for p in processors if not p.blocking]
        threaded = [p for p in processors if p.blocking]
        # One thread per agent for the blocking processors: their state is touched by that thread
        # only, and the loop stays free while they work.
        executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.config.concurrency, thread_name_prefix=f"proc-{topic_name}"
        )
        config = self.config
        for processor in threaded:  # the timer that closes idle windows runs them on this thread too
            self._executors.setdefault(id(processor), executor)

        async def handle_batch(events: list[Any]) -> None:
            records, dead = self._decode_batch(topic_name, record_type, events)
            EVENTS_IN.labels("worker", topic_name).inc(len(events))  # per batch: never per record
            ceiling = event_time_ceiling(time.time())
            if records and max(record.emitted_at for record, _ in records) > ceiling:  # a producer's clock is fast
                self._count_ahead(topic_name, [record for record, _ in records], ceiling)
            outputs = self._run_processors(topic_name, inline, records)
            if threaded:
                loop = asyncio.get_running_loop()
                outputs += await loop.run_in_executor(executor, self._run_processors, topic_name, threaded, records)
            # Outputs before the state changes that made them: should the worker die between the
            # two, the state is older than the outputs and a replay makes them again (same ids).
            await self._send_all([*dead, *outputs])
            for processor in processors:  # on the loop: only here may a Faust table change
                if (state := self.table_states.get(id(processor))) is not None:
                    await self._send_changelog(state)
                if (keeper := self.snapshots.get(id(processor))) is not None:
                    await self._send_snapshot(keeper)

        async def agent(stream: Any) -> None:
            # take_batches (Faust's take_events without its per-record iterator) acknowledges a
            # batch when the loop comes back here, or when a cancellation leaves it: so the batch is
            # finished first (streams/faust_batches.py), its outputs in the producer, which Faust
            # flushes before it commits the offsets.
            async with aclosing(take_batches(stream, config.batch_size, config.batch_within_s)) as batches:
                async for events in batches:
                    await finish_before_cancel(handle_batch(events))

        agent.__name__ = agent.__qualname__ = "agent_" + topic_name.replace(".", "_")
        self.app.agent(source, name=f"{self.app.conf.id}.{topic_name}", concurrency=config.concurrency)(agent)

    # --- per batch -----------------------------------------------------------------------------
    def _decode_batch(
        self, topic: str, record_type: type[Event], events: Sequence[Any]
    ) -> tuple[list[tuple[Event, Any]], list[DeadLetter]]:
        records: list[tuple[Event, Any]] = []
        dead: list[DeadLetter] = []
        values: list[bytes] = [event.value or b"" for event in events]
        # The sinks' batch decoder: the same checks as ``decode`` per record, the id and time checks
        # in a few passes over the batch, the clock read once, the garbage collector paused.
        for event, value, item in zip(events, values, decode_many(values, self.config.max_record_bytes), strict=True):
            message = event.message
            if not isinstance(item, CodecError) and not isinstance(item, record_type):
                item = CodecError(f"a {type(item).__name__} record on topic {topic}")
                item.error_type = "wrong_topic"
            if isinstance(item, CodecError):
                dead.append(self.dead_letter(topic, message.partition, message.offset, message.key, value, item))
                continue
            records.append((item, message))
        self.counts["records"] += len(records)
        self.counts["dead_letters"] += len(dead)
        return records, dead

    def _run_processors(
        self, topic: str, processors: Sequence[Processor], batch: list[tuple[Event, Any]]
    ) -> list[Event]:
        """Runs on the event loop (the fast processors) or the agent's executor thread (blocking ones).

        Faust acknowledges a batch even when the agent raises (``take_events`` acks in a
        ``finally``), so raising would lose the batch. Processors are pure, so an exception is a
        deterministic bug: the batch is retried record by record and the records that still fail
        become dead letters (``error_type="processor_error"``): kept, counted, replayable.
        """
        out: list[Event] = []
        if not batch:
            return out
        records = [record for record, _ in batch]
        newest: dict[tuple[str, int], float] = {}  # per partition: the watermark's sources
        for record, message in batch:
            source = (topic, message.partition)
            newest[source] = max(newest.get(source, record.emitted_at), record.emitted_at)
        for processor in processors:
            with self._locks[id(processor)]:
                out.extend(self._run_processor(topic, processor, batch, records, newest))
        return out

    def _run_processor(
        self, topic: str, processor: Processor, batch: list[tuple[Event, Any]], records: list[Event],
        newest: dict[tuple[str, int], float],
    ) -> list[Event]:
        out: list[Event] = []
        keeper = self.snapshots.get(id(processor))
        if keeper is not None:  # records its restored state already counted are not counted again
            keeper.restore_once()
            batch = keeper.unseen(batch)
            records = [record for record, _ in batch]
        state = self.table_states.get(id(processor))
        key_of = state.spec.key_of if state is not None else None
        if key_of is not None:
            # Each state change goes to the changelog partition of the record that caused it
            # (co-partitioning): the spec says which key each record writes.
            state.batch_partitions = {key_of(record).encode(): message.partition for record, message in batch}
            try:
                out.extend(self._process_isolating(topic, processor, batch, records))
            finally:
                state.batch_partitions = None
        elif state is not None:
            # Without ``key_of`` the processor sees one input partition at a time, for the same reason.
            by_partition: dict[int, list[tuple[Event, Any]]] = defaultdict(list)
            for record, message in batch:
                by_partition[message.partition].append((record, message))
            try:
                for partition, group in by_partition.items():
                    state.partition = partition
                    out.extend(self._process_isolating(topic, processor, group, [r for r, _ in group]))
            finally:
                state.partition = None
        else:
            out.extend(self._process_isolating(topic, processor, batch, records))
        cadence = self._watermarks[id(processor)]
        try:  # the batch was processed: nothing here may keep it from being acknowledged
            if not cadence.started:  # its first events: wait for the partitions that have records to read
                cadence.expect(self._partitions_behind(self._input_names(processor)))
        except Exception:  # the consumer cannot say (not started, rebalancing): wait for none
            log.warning("processor %s: partitions with records to read unknown", processor.name, exc_info=True)
        for source, event_time in newest.items():
            cadence.note(event_time, source)
        out.extend(self._watermark_outputs(processor))
        if state is not None:
            state.seal()  # each key written by the batch encoded once, under the processor's lock
        if keeper is not None:
            keeper.cover(batch)
        return out

    def _watermark_outputs(self, processor: Processor, caught_up: bool = False) -> list[Event]:
        """``processor.on_watermark`` when its cadence says so; a failure is logged, never raised
        (the batch's records were processed and must be acknowledged)."""
        cadence = self._watermarks[id(processor)]
        try:
            if cadence.due(caught_up=caught_up):
                return list(processor.on_watermark(cadence.event_time))
        except Exception:
            log.exception("processor %s failed in on_watermark", processor.name)
        return []

    def _count_ahead(self, topic: str, records: list[Event], ceiling: float) -> None:
        """Count (and, at most once a minute, name the nodes of) records ahead of this worker's
        clock; the cadences cap their event time (``WatermarkCadence.note``)."""
        ahead = [r for r in records if r.emitted_at > ceiling]
        self.events_ahead += len(ahead)
        EVENTS_AHEAD.labels("worker").inc(len(ahead))
        now = time.monotonic()
        if now - self._ahead_logged_at >= 60:
            self._ahead_logged_at = now
            worst = max(ahead, key=lambda r: r.emitted_at)
            log.warning("%d record(s) on %s ahead of this worker's clock, by up to %.0f s (node %s); check the "
                        "producers' clocks (NTP). They count in their own windows but close none early "
                        "(entroloop_events_ahead_of_clock_total)", len(ahead), topic,
                        worst.emitted_at - ceiling + MAX_AHEAD_OF_CLOCK_S, worst.node_id)

    def _input_names(self, processor: Processor) -> set[str]:
        return {TOPIC_BY_TYPE[t].name for t in processor.inputs}

    def partitions_not_held(self, assignment: Iterable[Any],
                            partition_count: Callable[[str], int | None] = lambda topic: None) -> dict[str, int]:
        """Per aggregating processor (``needs_every_partition``), the partitions of its inputs this
        worker does not hold; more than 0 while it holds some: other workers of its group read the
        rest, so its windows and trigger counts are partial ({} while it holds none: a rebalance, or
        an idle worker). ``partition_count``: a topic's partitions as the broker says (full name),
        else ``ENTROLOOP_PARTITIONS``."""
        prefix = self.config.topic_prefix
        aggregating = [p for p in self.processors if p.needs_every_partition]
        inputs = set().union(*(self._input_names(p) for p in aggregating)) if aggregating else set()
        held = Counter(name for name in (tp.topic.removeprefix(prefix) for tp in assignment) if name in inputs)
        if not held:
            return {}

        def missing(topic: str) -> int:
            total = partition_count(prefix + topic) or self.config.partitions
            return max(0, total - held[topic])

        return {p.name: sum(missing(t) for t in self._input_names(p)) for p in aggregating}

    def _warn_partial_aggregates(self, missing: dict[str, int]) -> None:
        partial = {name: n for name, n in missing.items() if n}
        now = time.monotonic()
        if not partial or now - self._partial_logged_at < 60:
            return
        self._partial_logged_at = now
        log.error("%s count over every request, but other workers of group %s hold %s of their input partitions: "
                  "their windows, alerts and triggers see only this worker's share. Run the aggregating processors "
                  "in exactly one worker (`entroloop worker --role aggregates`) and scale the others with "
                  "`--role requests` (docs/distributed.md)", ", ".join(sorted(partial)), self.app.conf.id,
                  ", ".join(f"{n} ({name})" for name, n in sorted(partial.items())))

    # --- when the traffic stops ----------------------------------------------------------------
    async def _close_windows_when_idle(self) -> None:
        """Timer: the watermark of processors whose inputs went silent moves on with wall time once
        the broker confirms that every record of their input partitions was processed and committed
        (``WatermarkCadence``), so the last windows close and their alerts go out without waiting
        for the next request. Run where the processor's batches run: on the loop, or for a blocking
        one in its agent's thread."""
        await self._restore_into_silence()
        idle = [p for p in self.processors if self._watermarks[id(p)].idle()]
        if not idle or not await self._caught_up(set().union(*(self._input_names(p) for p in idle))):
            return
        loop = asyncio.get_running_loop()
        for processor in idle:
            def close(processor: Processor = processor) -> list[Event]:
                with self._locks[id(processor)]:
                    out = self._watermark_outputs(processor, caught_up=True)
                    if (state := self.table_states.get(id(processor))) is not None:
                        state.seal()
                    return out

            executor = self._executors.get(id(processor))
            outputs = await loop.run_in_executor(executor, close) if executor else close()
            await self._send_all(outputs)  # before the state changes that made them, as in a batch
            if (state := self.table_states.get(id(processor))) is not None:
                await self._send_changelog(state)

    def _count_refetches(self, partitions: int) -> None:
        """``entroloop.streams.faust_recovery_watch`` fetched ``partitions`` changelog partitions again."""
        self.recovery_refetches += partitions

    async def _restore_into_silence(self) -> None:
        """A restarted worker that no record reaches (its inputs were all committed before the
        restart) restores each aggregating processor's snapshot here instead of on the first batch,
        and starts its event time from the snapshot's newest one, counted as silent for ``idle_s``
        already (``WatermarkCadence.resume``): the idle timer then moves it on by the time since the
        restart and closes the restored windows that time has passed. Each processor is asked about
        on its own inputs (one busy input of another processor must not hold it back). Only when the
        broker confirms nothing is left to read: with records
        to come, the first batch restores it and the event time waits for every partition behind
        (``WatermarkCadence.expect``). Timers run once Faust's first recovery is done, so the
        snapshot table is complete."""
        for processor in self.processors:
            keeper, cadence = self.snapshots.get(id(processor)), self._watermarks[id(processor)]
            if keeper is None or keeper.restored or cadence.started:
                continue
            if not await self._caught_up(self._input_names(processor)):
                continue
            with self._locks[id(processor)]:
                keeper.restore_once()
            if keeper.event_time > float("-inf"):
                cadence.resume(keeper.event_time)

    async def _caught_up(self, topics: set[str]) -> bool:
        """True when the broker answers and no assigned partition of ``topics`` has a record past
        the committed offset. Not caught up when the broker cannot say (an outage: the serving
        nodes' buffered records are still to come) or nothing is assigned (a rebalance)."""
        consumer, prefix = self.app.consumer, self.config.topic_prefix
        assigned = [tp for tp in list(consumer.assignment()) if tp.topic.removeprefix(prefix) in topics]
        if not assigned:
            return False
        try:
            ends = await consumer.highwaters(*assigned)
        except Exception as exc:  # noqa: BLE001 - the broker did not answer: not known to be caught up
            log.debug("idle watermark: end offsets not read: %r", exc)
            return False
        return all(end <= self._committed(tp) for tp, end in ends.items())

    def _process_isolating(
        self, topic: str, processor: Processor, batch: list[tuple[Event, Any]], records: list[Event]
    ) -> list[Event]:
        """One processor on one batch; a failing batch is isolated record by record (see above)."""
        out: list[Event] = []
        try:
            out.extend(processor.process_batch(records))
        except Exception:
            log.exception("processor %s failed on a batch of %d records; isolating", processor.name, len(records))
            for record, message in batch:
                try:
                    out.extend(processor.process_batch([record]))
                except Exception as exc:  # noqa: BLE001
                    err = CodecError(f"{processor.name}: {exc!r}"[:1000])
                    err.error_type = "processor_error"
                    out.append(self.dead_letter(topic, message.partition, message.offset, message.key, encode(record), err))
                    self.counts["processor_errors"] += 1
        return out

    async def _send_all(self, records: Sequence[Event]) -> None:
        """Hand ``records`` to the producer (Faust flushes it before every offset commit).

        Straight to the producer, not through ``Topic.send``: Faust's per-message future, sensor
        and callback bookkeeping cost more than the processors themselves at fleet rates."""
        if not records:
            return
        prefix = self.config.topic_prefix
        limit = self.app.conf.producer_max_request_size
        rows = []
        swapped: dict[int, Event] = {}  # index -> the dead letter sent instead (rare)
        for i, record in enumerate(records):
            value = encode(record)
            if len(value) > limit:  # the broker would refuse it for good: a dead letter says why
                record = swapped[i] = self.oversized_output(record, value, limit)
                value = encode(record)
            rows.append((prefix + record.topic, record.request_id.encode(), value, None))
        if swapped:  # count what was sent
            records = [swapped.get(i, record) for i, record in enumerate(records)]
        await self._produce(rows)
        self.counts["sent"] += len(records)
        for topic, n in Counter(record.topic for record in records).items():
            EVENTS_OUT.labels("worker", topic).inc(n)
        for source, n in Counter(r.source_topic for r in records if isinstance(r, DeadLetter)).items():
            DEAD_LETTERS.labels("worker", source).inc(n)

    async def _send_changelog(self, state: TableState[Any]) -> None:
        """Apply the batch's table writes and hand their changelog records (one per key) to the
        producer, straight, like the outputs (``Table.send_changelog`` goes through Faust's
        per-message buffer)."""
        records = state.drain(unsealed=False)
        if not records:
            return
        topic = state.table.changelog_topic.get_topic_name()
        await self._produce([(topic, key, raw, partition) for partition, key, raw in records])
        self.counts["changelog"] += len(records)

    async def _send_snapshot(self, keeper: SnapshotKeeper) -> None:
        """Hand the processor's newest snapshot to the producer if a batch changed it. Taken and
        handed over one at a time, so the changelog's last record is the newest snapshot."""
        async with keeper.sending:
            if not keeper.dirty:
                return
            with self._locks[id(keeper.processor)]:
                raw = keeper.take(self._watermarks[id(keeper.processor)].newest_heard)
            limit = self.app.conf.producer_max_request_size
            if len(raw) > limit - 1024:  # the broker would refuse it, and a refusal stops the commits
                keeper.unwritten += 1
                log.error("%s: its snapshot is %d bytes, over the producer's request size (%d): not written; a "
                          "crash now would lose the counts since the last one written", keeper.processor.name,
                          len(raw), limit)
                return
            topic = keeper.table.changelog_topic.get_topic_name()
            await self._produce([(topic, SNAPSHOT_KEY, raw, SNAPSHOT_PARTITION)])
            self.counts["snapshots"] += 1

    async def _produce(self, records: Sequence[tuple[str, bytes, bytes, int | None]]) -> None:
        """Hand ``(topic, key, value, partition or None: by key)`` records to the producer, one
        aiokafka batch per topic partition (in order), not one ``send`` (and future) per record.

        Same producer, partitioner and delivery as ``producer.send`` (Faust flushes it before every
        offset commit, batches included): a keyed record goes to ``key_partition``, the partition
        ``send`` would choose. Its per-record future was the largest single cost left in the
        worker's loop after the processors (``entroloop bench workers``, py-spy)."""
        producer = self.app.producer
        aio = producer._ensure_producer()  # the aiokafka producer Faust's ``send`` uses
        for topic in {topic for topic, _, _, partition in records if partition is None}:
            await aio.partitions_for(topic)  # a key's partition needs the topic's metadata (cached after the first)
        groups: dict[tuple[str, int], list[tuple[bytes, bytes]]] = defaultdict(list)
        for topic, key, value, partition in records:
            if partition is None:
                partition = producer.key_partition(topic, key).partition
            groups[(topic, partition)].append((key, value))
        for (topic, partition), rows in groups.items():
            batch = aio.create_batch()
            for key, value in rows:
                if batch.append(key=key, value=value, timestamp=None) is None:  # full: send it, start the next
                    await self._send_batch(aio, batch, topic, partition)
                    batch = aio.create_batch()
                    batch.append(key=key, value=value, timestamp=None)  # an empty batch takes any first record
            await self._send_batch(aio, batch, topic, partition)

    async def _send_batch(self, aio: Any, batch: Any, topic: str, partition: int) -> None:
        try:
            future = await aio.send_batch(batch, topic, partition=partition)
        except Exception as exc:
            self.deliveries.fail(exc)  # Faust acknowledges the batch even so: the guard stops the commits
            raise
        future.add_done_callback(self._on_delivered)
        self.deliveries.track(future)  # a refusal stops the offset commits (entroloop.streams.faust_delivery)

    def _on_delivered(self, future: Any) -> None:
        if not future.cancelled() and future.exception() is not None:
            self.counts["send_errors"] += 1
            log.error("an output record was not delivered: %r", future.exception())

    def oversized_output(self, record: Event, value: bytes, limit: int) -> DeadLetter:
        """The dead letter that takes the place of an output over the producer's request size
        (``producer_max_request_size``): no broker would take it, and a refusal would stop the
        commits for good. It keeps the output's first bytes, size and SHA-256; the output itself
        can be derived again from its inputs, which stay in Kafka and the audit log."""
        self.counts["oversized_outputs"] += 1
        self.counts["dead_letters"] += 1
        reason = (f"a {type(record).__name__} output of {len(value)} bytes exceeds the producer's request size "
                  f"of {limit} bytes (and the broker's message.max.bytes default); not sent")
        log.error("worker: %s (request %s)", reason, record.request_id[:200])
        return derive(record, DeadLetter, 0, "oversized_output", source_topic=record.topic, source_partition=0,
                      source_offset=0, **failure_fields(reason, RecordTooLarge.error_type, value))

    def dead_letter(
        self, topic: str, partition: int, offset: int, key: bytes | None, value: bytes, err: CodecError
    ) -> DeadLetter:
        """Same shape as the embedded runner's: a redelivered poison record gets the same event id."""
        return dead_letter_at(topic, partition, offset, key=key, payload=value, error=err, node_id=self.config.node_id)

    # --- health --------------------------------------------------------------------------------
    def _partitions_behind(self, topics: set[str]) -> list[tuple[str, int]]:
        """The assigned partitions of ``topics`` whose end offset is past the committed one (records
        not processed yet); a partition not fetched yet counts as not behind."""
        prefix, behind = self.config.topic_prefix, []
        for tp in list(self.app.consumer.assignment()):
            name = tp.topic.removeprefix(prefix)
            if name not in topics:
                continue
            offsets = self._end_and_committed(tp)
            if offsets and offsets[0] and offsets[0] > offsets[1]:
                behind.append((name, tp.partition))
        return behind

    def _count_new(self, counter: Any, key: tuple[str, int], total: int) -> None:
        """Add to a Prometheus counter what a processor's running ``total`` gained since the last call."""
        counter.inc(total - self._counted.get(key, 0))
        self._counted[key] = total

    def _end_and_committed(self, tp: Any) -> tuple[int | None, int] | None:
        """``tp``'s end offset (None: unknown) and committed offset; None before its first fetch."""
        consumer = self.app.consumer
        try:
            highwater = consumer.highwater(tp)
        except Exception:  # noqa: BLE001 - not fetched yet
            return None
        return highwater, self._committed(tp)

    def _committed(self, tp: Any) -> int:
        """``tp``'s committed offset: the broker's answer to this worker's last commit, else the one
        Faust read on assignment, else 0."""
        return self.commits.committed.get(tp) or self.app.consumer._committed_offset.get(tp) or 0

    def health_records(self) -> list[Health]:
        """Consumer lag per assigned partition, the age of the last commit, the records ahead of this
        worker's clock, the keys held per durable state table, the late events each windowed
        processor dropped and the size of each aggregating processor's snapshot, as Health records."""
        consumer = self.app.consumer
        now = time.time()
        commit_age = self.commits.age(consumer, self._guarded_topics)
        LAST_COMMIT.labels("worker").set(now - commit_age)
        records = [
            Health(
                **self.stamper.stamp(now),
                request_id="",
                component="streams",
                metric="last_commit_age_s",
                value=commit_age,
                labels={"app": self.app.conf.id},
            )
        ]
        records.append(Health(**self.stamper.stamp(now), request_id="", component="streams",
                              metric="events_ahead_of_clock", value=float(self.events_ahead),
                              labels={"app": self.app.conf.id}))
        records.append(Health(**self.stamper.stamp(now), request_id="", component="streams",
                              metric="recovery_refetches", value=float(self.recovery_refetches),
                              labels={"app": self.app.conf.id}))
        missing = self.partitions_not_held(list(consumer.assignment()), consumer.topic_partitions)
        self._warn_partial_aggregates(missing)
        for name, count in sorted(missing.items()):
            records.append(Health(**self.stamper.stamp(now), request_id="", component="streams",
                                  metric="aggregate_partitions_not_held", value=float(count),
                                  labels={"app": self.app.conf.id, "processor": name}))
        for processor in self.processors:
            late = getattr(processor, "late_events", None)  # windowed processors: events their closed windows refused
            if late is not None:
                self._count_new(LATE_EVENTS.labels("worker", processor.name), ("late", id(processor)), late)
                records.append(Health(**self.stamper.stamp(now), request_id="", component="streams",
                                      metric="late_events", value=float(late),
                                      labels={"app": self.app.conf.id, "processor": processor.name}))
            if (keeper := self.snapshots.get(id(processor))) is not None:  # how close to the request size
                for metric, value in (("snapshot_bytes", keeper.last_bytes), ("snapshots_unwritten", keeper.unwritten)):
                    records.append(Health(**self.stamper.stamp(now), request_id="", component="streams",
                                          metric=metric, value=float(value),
                                          labels={"app": self.app.conf.id, "processor": processor.name}))
            state = self.table_states.get(id(processor))
            if state is None:
                continue
            entries = len(state)
            TABLE_ENTRIES.labels("worker", state.spec.name).set(entries)
            records.append(Health(**self.stamper.stamp(now), request_id="", component="streams",
                                  metric="table_entries", value=float(entries),
                                  labels={"app": self.app.conf.id, "table": state.spec.name}))
            evicted = getattr(processor, "evicted", None)  # keys dropped to keep the table under its bound
            if evicted is not None:
                self._count_new(TABLE_EVICTED.labels("worker", state.spec.name), ("evicted", id(processor)), evicted)
                records.append(Health(**self.stamper.stamp(now), request_id="", component="streams",
                                      metric="table_evicted", value=float(evicted),
                                      labels={"app": self.app.conf.id, "table": state.spec.name}))
        prefix = self.config.topic_prefix
        for tp in sorted(consumer.assignment(), key=lambda t: (t.topic, t.partition)):
            if tp.topic.removeprefix(prefix) not in self.input_topics:
                continue  # Faust's own internal topics
            offsets = self._end_and_committed(tp)
            if offsets is None:
                continue
            highwater, committed = offsets
            CONSUMER_LAG.labels("worker", tp.topic.removeprefix(prefix), str(tp.partition)).set(
                max(0, (highwater or 0) - committed))
            records.append(
                Health(
                    **self.stamper.stamp(now),
                    request_id="",
                    component="streams",
                    metric="consumer_lag",
                    value=float(max(0, (highwater or 0) - committed)),
                    labels={"app": self.app.conf.id, "topic": tp.topic, "partition": str(tp.partition)},
                )
            )
        return records

    async def _publish_health(self) -> None:
        await self._send_all(self.health_records())

    # --- running -------------------------------------------------------------------------------
    def ensure_topics(self) -> list[str]:
        """Create every v1 topic (with the prefix) that does not exist yet."""
        from entroloop.streams.changelog_topics import ensure_changelog_topics

        from entroloop.infra.kafka_topics import ensure_topics

        created = ensure_topics(self.config.bootstrap, self.config.topic_prefix, self.config.partitions)
        tables = [state.table for state in self.table_states.values()] + [k.table for k in self.snapshots.values()]
        changelogs = [table.changelog_topic.get_topic_name() for table in tables]
        return created + ensure_changelog_topics(self.config.bootstrap, changelogs, self.config.partitions)

    def run(self, loglevel: str = "warn") -> None:
        """Run a Faust worker in this process until SIGTERM/SIGINT (topics are created first,
        because a consumer subscribed to a missing topic is not re-subscribed for minutes)."""
        from faust.worker import Worker

        class QuietWorker(Worker):
            def _setup_logging(self) -> None:
                super()._setup_logging()
                # mode leaves the root logger at DEBUG and filters in the handler, so every debug
                # call of aiokafka and Faust (several per record) built a LogRecord to be dropped.
                level = logging.getLevelName(loglevel.upper())
                if isinstance(level, int):
                    logging.getLogger().setLevel(level)

            async def on_start(self) -> None:
                await super().on_start()
                # a table recovery waiting for changelog records that never come is fetched again
                self.add_future(watch_recovery(self.app, streams._count_refetches))

            async def on_stop(self) -> None:
                # Every way of stopping passes here (a signal, a crashed service); a stop that hangs
                # (the consumer thread gone after a Fetcher crash) must not leave a silent process.
                arm_stop_watchdog(grace_s, lambda: repr(self.crash_reason) if self.crash_reason else "a stop request")
                await super().on_stop()

        grace_s = self.config.stop_grace_s
        streams = self

        self.ensure_topics()
        tune_for_streaming()  # the start-up heap frozen, collections batched (entroloop.infra.gc_policy)
        QuietWorker(self.app, loglevel=loglevel, quiet=True).execute_from_commandline()


def build_streams_app(
    settings: Settings,
    processors: Sequence[Processor] | None = None,
    processor_factory: Callable[[Settings], Sequence[Processor]] | None = None,
    **overrides: Any,
) -> StreamsApp:
    """The worker's app from settings; processors default to streams.defaults (the same list as the embedded runner)."""
    if processors is None:
        from entroloop.streams.defaults import (
            default_processors,  # every processor module: only when asked
        )

        processors = (processor_factory or default_processors)(settings)
    return StreamsApp(StreamsConfig.from_settings(settings, **overrides), processors)


__all__ = ["ISSUE_606", "StreamsApp", "StreamsConfig", "UnsafeConcurrency", "build_streams_app"]
