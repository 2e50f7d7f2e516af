"""Sinks as Kafka consumers: decode, batch per (topic, partition), write durably, then commit.

One ``KafkaSinkConsumer`` drives one durable target (``ClickHouseSink`` or ``AuditParquetWriter``,
anything with ``write(topic, partition, first_offset, last_offset, records)``) from a consumer
group of its own (``<prefix>entroloop-sink-<kind>``), with ``enable.auto.commit=false``:

* Each message is decoded with ``entroloop.contract.codec``; a poison message (or a record of the wrong
  kind for its topic) becomes a ``DeadLetter`` produced to the dead-letter topic with its reason,
  and the producer is flushed before any offset past it is committed. The consumer never crashes
  on bad bytes.
* Every assigned partition has its own ``sinks.batching.SinkBatcher``, so each write covers one
  contiguous offset range of one partition and its idempotency key (ClickHouse's
  ``insert_deduplication_token``, the audit object keys) names exactly that range.
* Offsets are committed synchronously, next offset per partition, only after the write returned.
* A record the target refuses on its own (``ClickHouseSink`` bisects a failed insert and reports
  each such record with ClickHouse's error) becomes a dead letter (``insert_rejected``) like a
  poison message, and the rest of its batch is stored: one bad row never stops the partition.

**Why a write journal.** Offset-aligned cuts make a redelivered range reproduce its token only
when row bounds closed the batch; a batch closed by the clock (``max_seconds``) or by shutdown can
be cut differently after a crash, and a different token means a second copy of the rows (or a
second audit file). So before it writes a range the consumer commits the partition's *current*
offset again with the range in the commit metadata (``entroloop-pending:F-L[,F2-L2...]``). After a
crash between write and commit, the next owner of the partition reads that metadata from the
group's committed offsets and rewrites exactly those ranges first: same tokens, same object keys,
so ClickHouse drops the repeat and the audit writer recognises its batch. The journal lives in
Kafka itself (no extra store), costs one synchronous commit per write, and works across processes
and rebalances because the metadata travels with the partition's offset.

**Backpressure.** A batcher that is full raises ``SinkBackpressure`` before taking anything; the
consumer pauses that partition, seeks it back to the first offset it did not take and keeps polling
(so the group does not rebalance) and flushing; it resumes the partition when its batcher has
room for a full batch again. A failing target (ClickHouse down) is retried by the batcher with
backoff, so an outage becomes pause, not unbounded memory.

**Rebalance.** On revocation buffered batches are flushed and committed while the partitions are
still ours; what cannot be written is dropped (the next owner re-reads it from the committed
offset and, thanks to the journal, replays any range already written). Lost partitions (session
expired) are dropped without a commit.

``ENTROLOOP_FAULT_KILL_AFTER_WRITE=N`` (tests only, read by ``fault_kill_after_write``) SIGKILLs the
process right after its N-th durable write, before the offset commit: the crash this module must
survive without a duplicate.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from entroloop.contract.codec import (
    CodecError,
    EventTimeWindow,
    dead_letter_fields,
    decode_many,
    encode,
)
from entroloop.contract.ids import derived_event_id
from entroloop.contract.records import DeadLetter, Event
from entroloop.contract.settings import Settings
from entroloop.contract.topics import TOPIC_BY_NAME
from entroloop.infra.kafka_consumer_config import manual_commit_consumer_config
from sinks.batching import SinkBatcher, Slice

log = logging.getLogger("entroloop.sinks.kafka")

FAULT_KILL_AFTER_WRITE_ENV = "ENTROLOOP_FAULT_KILL_AFTER_WRITE"
JOURNAL_TAG = "entroloop-pending:"
# Kafka's offset.metadata.max.bytes defaults to 4096; stay well below it
JOURNAL_MAX_CHARS = 3000


class SinkTarget(Protocol):
    def write(self, topic: str, partition: int, first_offset: int, last_offset: int, records: Sequence[Any]) -> Any: ...


class BrokerUnreachable(RuntimeError):
    """The Kafka bootstrap servers did not answer a metadata request in time."""


class JournalMismatch(RuntimeError):
    """A write does not line up with the partition's pending ranges (a cut that would duplicate)."""


# --- test-only fault hook ---------------------------------------------------------------------------
_fault_writes = 0


def fault_kill_after_write() -> int:
    """N from ``ENTROLOOP_FAULT_KILL_AFTER_WRITE`` (0: off). The only place that reads it."""
    value = os.environ.get(FAULT_KILL_AFTER_WRITE_ENV, "").strip()
    return int(value) if value.isdigit() else 0


def _after_durable_write(description: str) -> None:
    """Count a durable write; SIGKILL this process after the N-th when the fault hook is set."""
    global _fault_writes
    _fault_writes += 1
    n = fault_kill_after_write()
    if n and _fault_writes >= n:
        print(f"fault: SIGKILL after durable write {_fault_writes} ({description}), before its commit",
              file=sys.stderr, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)


# --- the journal in commit metadata -----------------------------------------------------------------
Range = tuple[int, int]


def format_journal(ranges: Sequence[Range]) -> str:
    return JOURNAL_TAG + ",".join(f"{f}-{l}" for f, l in ranges) if ranges else ""


def parse_journal(metadata: str | None, committed_offset: int) -> list[Range]:
    """Pending ranges recorded at ``committed_offset`` (ranges below it are done; junk is ignored)."""
    if not metadata or not metadata.startswith(JOURNAL_TAG):
        return []
    ranges: list[Range] = []
    for part in metadata[len(JOURNAL_TAG):].split(","):
        first, sep, last = part.partition("-")
        if not (sep and first.isdigit() and last.isdigit()):
            return []
        ranges.append((int(first), int(last)))
    ranges = [r for r in ranges if r[1] >= committed_offset]
    # the journal is a chain of consecutive ranges starting at the committed offset
    expected = committed_offset
    for first, last in ranges:
        if first != expected or last < first:
            return []
        expected = last + 1
    return ranges


# --- state ------------------------------------------------------------------------------------------
@dataclass
class SinkStats:
    messages: int = 0
    records: int = 0
    dead_letters: int = 0
    writes: int = 0
    rows_written: int = 0
    replayed_ranges: int = 0
    replayed_rows: int = 0
    commits: int = 0
    commit_failures: int = 0
    pauses: int = 0
    rebalances: int = 0
    dropped_on_revoke: int = 0
    started: float = field(default_factory=time.monotonic)
    first_message: float | None = None

    def as_dict(self) -> dict[str, Any]:
        now = time.monotonic()
        out = {k: v for k, v in self.__dict__.items() if k not in ("started", "first_message")}
        out["elapsed_s"] = round(now - self.started, 3)
        # from the first message to the end: the figure that excludes start-up and the group join
        active = max(now - (self.first_message or now), 1e-9)
        out["active_s"] = round(active, 3)
        out["rows_per_s"] = round(self.rows_written / active, 1) if self.first_message else 0.0
        return out


@dataclass
class _Partition:
    """What the consumer knows about one assigned partition."""

    kafka_topic: str
    topic: str  # the registry name (targets look tables and keys up by it)
    partition: int
    batcher: SinkBatcher
    expected: int | None = None  # next offset to take
    committed: int | None = None  # the group's committed offset (where a journal must start)
    pending: list[Range] = field(default_factory=list)  # written or about to be, not yet committed
    replay: list[Range] = field(default_factory=list)  # pending ranges found at assignment: rewrite first
    replay_pairs: list[tuple[int, Event]] = field(default_factory=list)
    paused: bool = False
    eof: bool = False


class _PartitionTarget:
    """The batcher's target for one partition: journals each range, then writes it."""

    def __init__(self, sink: KafkaSinkConsumer, key: tuple[str, int]) -> None:
        self.sink = sink
        self.key = key

    def write_slices(self, topic: str, slices: Sequence[Slice]) -> int:
        state = self.sink._states[self.key]
        return sum(self.sink._write_range(state, s.first, s.last, s.records) for s in slices)


# --- the consumer -----------------------------------------------------------------------------------
class KafkaSinkConsumer:
    """Consumes ``topics`` (registry names) into ``target``; see the module docstring."""

    def __init__(
        self,
        kind: str,
        target: SinkTarget,
        topics: Iterable[str],
        settings: Settings,
        *,
        max_rows: int | None = None,
        max_seconds: float | None = None,
        partition_buffer_rows: int | None = None,
        session_timeout_s: float = 30.0,
        consumer_config: dict[str, Any] | None = None,
    ) -> None:
        from confluent_kafka import Consumer, Producer

        self.kind = kind
        self.target = target
        self.settings = settings
        self.prefix = settings.topic_prefix
        self.topics = list(topics)
        for name in self.topics:
            if name not in TOPIC_BY_NAME:
                raise ValueError(f"unknown topic {name!r}")
        self.max_rows = max_rows or settings.sink_batch_rows
        self.max_seconds = max_seconds or settings.sink_batch_seconds
        self.partition_buffer_rows = max(partition_buffer_rows or 2 * self.max_rows, self.max_rows)
        self.group_id = f"{self.prefix}entroloop-sink-{kind}"
        config = manual_commit_consumer_config(
            settings, group_id=self.group_id, client_id=f"entroloop-sink-{kind}",
            logger_name="entroloop.sinks.kafka.librdkafka", session_timeout_s=session_timeout_s,
            **{"max.poll.interval.ms": 300_000},
        )
        config.update(consumer_config or {})
        self.consumer = Consumer(config)
        self.producer = Producer({
            "bootstrap.servers": settings.kafka_bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "client.id": f"entroloop-sink-{kind}-deadletters",
            "logger": logging.getLogger("entroloop.sinks.kafka.librdkafka"),
        })
        self.dead_letter_topic = self.prefix + DeadLetter.topic
        self.stats = SinkStats()
        self._time_window = EventTimeWindow.from_settings(settings)  # decode refuses events outside it
        self._states: dict[tuple[str, int], _Partition] = {}
        self._dead_letters_unflushed = 0
        self._dead_letter_errors: list[str] = []
        self._stop = threading.Event()

    # --- lifecycle -------------------------------------------------------------------------------
    def check_broker(self, timeout: float = 10.0) -> None:
        """Raise ``BrokerUnreachable`` (with the address) if the broker does not answer."""
        from confluent_kafka import KafkaException

        try:
            self.consumer.list_topics(timeout=timeout)
        except KafkaException as exc:
            raise BrokerUnreachable(
                f"Kafka broker {self.settings.kafka_bootstrap} did not answer within {timeout:.0f} s ({exc.args[0]}); "
                "check ENTROLOOP_KAFKA_BOOTSTRAP (`make services-up` starts a local broker)"
            ) from None

    def stop(self) -> None:
        """Ask ``run`` to finish: flush, commit, close (safe from a signal handler)."""
        self._stop.set()

    def run(self, until_empty: bool = False, max_idle_s: float | None = None, poll_s: float = 0.2) -> SinkStats:
        """Consume until ``stop()``, or until every assigned partition is drained (``until_empty``),
        or until ``max_idle_s`` passed with nothing arriving, nothing paused and nothing buffered;
        then flush, commit and close."""
        kafka_topics = [self.prefix + t for t in self.topics]
        self.consumer.subscribe(kafka_topics, on_assign=self._on_assign, on_revoke=self._on_revoke,
                                on_lost=self._on_lost)
        last_message = time.monotonic()
        drained_since: float | None = None
        try:
            while not self._stop.is_set():
                messages = self.consumer.consume(num_messages=10_000, timeout=poll_s)
                # idle means nothing to do: paused partitions and unwritten rows are work waiting
                busy = any(st.paused or st.batcher.buffered_rows for st in self._states.values())
                if self._take(messages) or busy:
                    last_message = time.monotonic()
                self._flush(force=False)
                self._resume_drained()
                if until_empty:
                    if self._drained():
                        self._flush(force=True)
                        idle = not any(s.batcher.buffered_rows for s in self._states.values())
                        drained_since = drained_since or time.monotonic()
                        if idle and time.monotonic() - drained_since >= 1.0:
                            break
                    else:
                        drained_since = None
                if max_idle_s is not None and time.monotonic() - last_message >= max_idle_s:
                    break
            self._flush(force=True)
        finally:
            try:
                self.consumer.close()  # leaves the group now, so others take the partitions at once
            finally:
                self.producer.flush(10)
        return self.stats

    def _drained(self) -> bool:
        """Every assigned partition read to its end. End-of-partition events can be stale (this
        sink's own dead letters land after them), so the high watermarks of the latest fetch
        responses have the last word (``run`` also waits for this to hold for a second, longer than
        a fetch round trip; asking the broker for each partition's watermark takes ~0.5 s each)."""
        from confluent_kafka import TopicPartition

        if not self._states or not all(s.eof and not s.replay and not s.paused for s in self._states.values()):
            return False
        for state in self._states.values():
            tp = TopicPartition(state.kafka_topic, state.partition)
            low, high = self.consumer.get_watermark_offsets(tp, cached=True)
            position = state.expected if state.expected is not None else low
            if high > position:
                state.eof = False
                return False
        return True

    # --- rebalance -------------------------------------------------------------------------------
    def _state_for(self, kafka_topic: str, partition: int) -> _Partition:
        key = (kafka_topic, partition)
        batcher = SinkBatcher(_PartitionTarget(self, key), max_rows=self.max_rows, max_seconds=self.max_seconds,
                              max_buffered_rows=self.partition_buffer_rows)
        return _Partition(kafka_topic, kafka_topic[len(self.prefix):], partition, batcher)

    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        self.stats.rebalances += 1
        log.info("assigned %d partition(s)", len(partitions))
        for tp in partitions:
            self._states[(tp.topic, tp.partition)] = self._state_for(tp.topic, tp.partition)
        try:
            committed = consumer.committed(partitions, timeout=30)
        except Exception as exc:  # noqa: BLE001 - without the journal a replay could duplicate: refuse
            raise RuntimeError(f"cannot read committed offsets of {len(partitions)} partitions: {exc}") from exc
        for tp in committed:
            state = self._states[(tp.topic, tp.partition)]
            if tp.offset >= 0:
                state.expected = state.committed = tp.offset
                state.replay = parse_journal(tp.metadata, tp.offset)
                if state.replay:
                    log.warning("%s[%d]: rewriting %d range(s) written before a crash: %s", tp.topic, tp.partition,
                                len(state.replay), state.replay)

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        self.stats.rebalances += 1
        for tp in partitions:
            state = self._states.get((tp.topic, tp.partition))
            if state is None:
                continue
            if not state.replay:
                # still ours: write what is buffered and commit it, so the next owner starts clean
                self._commit(state, state.batcher.flush_all())
            self.stats.dropped_on_revoke += state.batcher.drop_partition(state.topic, state.partition)
            del self._states[(tp.topic, tp.partition)]

    def _on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        # no longer ours: committing would fail and writing could race the new owner; forget it
        for tp in partitions:
            state = self._states.pop((tp.topic, tp.partition), None)
            if state:
                self.stats.dropped_on_revoke += state.batcher.drop_partition(state.topic, state.partition)

    # --- taking messages -------------------------------------------------------------------------
    def _take(self, messages: list[Any]) -> bool:
        from confluent_kafka import KafkaError

        grouped: dict[tuple[str, int], list[Any]] = {}
        at_end: set[tuple[str, int]] = set()
        for message in messages:
            err = message.error()
            key = (message.topic(), message.partition())
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    at_end.add(key)
                    continue
                if err.fatal():
                    raise RuntimeError(f"fatal Kafka error: {err}")
                log.warning("consumer error: %s", err)
                continue
            at_end.discard(key)  # a message after an end-of-partition event: not at the end any more
            grouped.setdefault(key, []).append(message)
        for key, group in grouped.items():
            state = self._states.get(key)
            if state is None or state.paused:
                continue  # revoked, or paused: the seek brings these back after resume
            state.eof = False
            self._take_partition(state, group)
        for key in at_end:
            state = self._states.get(key)
            if state is not None and not state.paused:
                state.eof = True
        return bool(grouped)

    def _decode(self, state: _Partition, messages: list[Any]) -> tuple[list[tuple[int, Event]], list[DeadLetter]]:
        pairs: list[tuple[int, Event]] = []
        dead: list[DeadLetter] = []
        record_type = TOPIC_BY_NAME[state.topic].record_type
        values = [message.value() or b"" for message in messages]
        # one batch decode (the collector paused for it); each item is a record or its CodecError
        for message, value, record in zip(messages, values, decode_many(values, self.settings.max_record_bytes, self._time_window)):
            if not isinstance(record, CodecError) and not isinstance(record, record_type):
                record = CodecError(f"a {type(record).__name__} record on topic {state.topic}")
                record.error_type = "wrong_topic"
            if isinstance(record, CodecError):
                dead.append(self._dead_letter(state, message, value, record))
                continue
            pairs.append((message.offset(), record))
        return pairs, dead

    def _dead_letter(self, state: _Partition, message: Any, value: bytes, err: CodecError) -> DeadLetter:
        """Same id as the embedded runner's and the Faust worker's: a redelivery repeats the id."""
        offset = message.offset()
        return DeadLetter(
            event_id=derived_event_id(f"{state.topic}/{state.partition}/{offset}", "dead_letter", at=0.0),
            emitted_at=time.time(),
            node_id=f"sink-{self.kind}",
            seq=offset,
            request_id=(message.key() or b"").decode(errors="replace"),
            source_topic=state.topic,
            source_partition=state.partition,
            source_offset=offset,
            **dead_letter_fields(err, value),
        )

    def _take_partition(self, state: _Partition, messages: list[Any]) -> None:
        if state.expected is not None:
            messages = [m for m in messages if m.offset() >= state.expected]  # stale after a seek
            if not messages:
                return
        # offsets without a message (compaction, transaction markers) belong to the range too
        first = state.expected if state.expected is not None else messages[0].offset()
        last = messages[-1].offset()
        if state.committed is None:
            state.committed = first  # no committed offset yet: the group starts here
        pairs, dead = self._decode(state, messages)
        if self.stats.first_message is None:
            self.stats.first_message = time.monotonic()
        self.stats.messages += len(messages)
        self.stats.records += len(pairs)

        if state.replay:
            self._produce_dead_letters(dead)
            replay_last = state.replay[-1][1]
            state.replay_pairs.extend(p for p in pairs if p[0] <= replay_last)
            state.expected = last + 1
            if last < replay_last:
                return
            self._finish_replay(state)
            pairs = [p for p in pairs if p[0] > replay_last]
            dead = []
            first = replay_last + 1
            if first > last:
                return

        room = state.batcher.max_buffered_rows - state.batcher.buffered_rows
        if len(pairs) > room:
            # take what fits, pause at the first record left out (fetched again after resume)
            cut = pairs[room][0]
            pairs = pairs[:room]
            dead = [d for d in dead if d.source_offset < cut]
            if cut > first:
                self._take_range(state, first, cut - 1, pairs, dead)
            self._pause(state, cut)
            return
        self._take_range(state, first, last, pairs, dead)

    def _take_range(self, state: _Partition, first: int, last: int, pairs: list[tuple[int, Event]],
                    dead: list[DeadLetter]) -> None:
        self._produce_dead_letters(dead)
        state.expected = last + 1
        if not pairs and not state.batcher.buffered_rows and not state.pending:
            # only poison here and nothing buffered before it: commit past it once it is delivered
            self._commit(state, [(state.topic, state.partition, last + 1)])
            return
        state.batcher.add(state.topic, state.partition, first, last, pairs)

    def _finish_replay(self, state: _Partition) -> None:
        """Rewrite the journaled ranges exactly as cut before the crash, then commit past them."""
        by_offset = state.replay_pairs
        for first, last in state.replay:
            records = [r for o, r in by_offset if first <= o <= last]
            if records:
                refused = self._target_write(state, first, last, [(o, r) for o, r in by_offset if first <= o <= last])
                self.stats.writes += 1
                self.stats.rows_written += len(records) - refused
                self.stats.replayed_rows += len(records) - refused
                _after_durable_write(f"replay {state.topic}[{state.partition}] {first}-{last}")
            self.stats.replayed_ranges += 1
        end = state.replay[-1][1] + 1
        state.pending = list(state.replay)
        state.replay, state.replay_pairs = [], []
        self._commit(state, [(state.topic, state.partition, end)])

    # --- backpressure ----------------------------------------------------------------------------
    def _pause(self, state: _Partition, offset: int) -> None:
        from confluent_kafka import TopicPartition

        tp = TopicPartition(state.kafka_topic, state.partition, offset)
        self.consumer.pause([tp])
        self.consumer.seek(tp)  # what was not taken is fetched again after resume
        state.paused = True
        state.eof = False
        state.expected = offset
        self.stats.pauses += 1
        log.info("%s[%d]: sink buffer full (%d rows%s); paused at offset %d", state.kafka_topic, state.partition,
                 state.batcher.buffered_rows, f", last error {state.batcher.last_error}" if state.batcher.last_error else "",
                 offset)

    def _resume_drained(self) -> None:
        from confluent_kafka import TopicPartition

        for state in self._states.values():
            if state.paused and state.batcher.has_room(self.max_rows):
                self.consumer.resume([TopicPartition(state.kafka_topic, state.partition)])
                state.paused = False

    # --- writing and committing ------------------------------------------------------------------
    def _flush(self, force: bool) -> None:
        for state in list(self._states.values()):
            if state.batcher.buffered_rows:
                done = state.batcher.flush_all() if force else state.batcher.flush_due()
                self._commit(state, done)

    def _write_range(self, state: _Partition, first: int, last: int, pairs: Sequence[tuple[int, Event]]) -> int:
        """Write ``first..last`` of a partition, split along its pending ranges; journal new ones first."""
        pieces: list[tuple[int, int]] = []
        cursor = first
        for pf, pl in state.pending:
            if pl < cursor:
                continue  # written already, commit failed: the next commit covers it
            if pf != cursor or pl > last:
                raise JournalMismatch(
                    f"{state.kafka_topic}[{state.partition}]: write {first}-{last} does not cover pending {pf}-{pl}"
                )
            pieces.append((pf, pl))
            cursor = pl + 1
        if cursor <= last:
            # the journal is a chain from the committed offset: a range starts where the chain ends
            # (offsets skipped before it held only poison, already dead-lettered)
            chain_end = state.pending[-1][1] + 1 if state.pending else state.committed
            start = cursor if chain_end is None else min(cursor, chain_end)
            self._journal(state, [*state.pending, (start, last)])
            pieces.append((start, last))
        written = 0
        for pf, pl in pieces:
            piece = [(o, r) for o, r in pairs if pf <= o <= pl]
            records = [r for _, r in piece]
            if records:
                refused = self._target_write(state, pf, pl, piece)
                self.stats.writes += 1
                self.stats.rows_written += len(records) - refused
                written += len(records) - refused
                _after_durable_write(f"{state.topic}[{state.partition}] {pf}-{pl}")
        return written

    def _target_write(self, state: _Partition, first: int, last: int, pairs: Sequence[tuple[int, Event]]) -> int:
        """Write one range; records the target refuses on their own are produced as dead letters.

        Returns how many were refused. The dead letters are flushed before any offset past them is
        committed (``_commit``).
        """
        records = [r for _, r in pairs]
        if not getattr(self.target, "isolates_poison", False):
            self.target.write(state.topic, state.partition, first, last, records)
            return 0
        refused = 0

        def dead_letter(index: int, record: Event, reason: str) -> None:
            nonlocal refused
            refused += 1
            offset = pairs[index][0]
            err = CodecError(f"ClickHouse refused the record: {reason}")
            err.error_type = "insert_rejected"
            value = encode(record)
            letter = DeadLetter(
                event_id=derived_event_id(f"{state.topic}/{state.partition}/{offset}", "dead_letter", at=0.0),
                emitted_at=time.time(),
                node_id=f"sink-{self.kind}",
                seq=offset,
                request_id=record.request_id,
                source_topic=state.topic,
                source_partition=state.partition,
                source_offset=offset,
                **dead_letter_fields(err, value),
            )
            log.warning("%s[%d] offset %d: dead-lettered, %s", state.kafka_topic, state.partition, offset, err.reason[:300])
            self._produce_dead_letters([letter])

        self.target.write(state.topic, state.partition, first, last, records, on_poison=dead_letter)
        return refused

    def _journal(self, state: _Partition, ranges: list[Range]) -> None:
        """Record ``ranges`` as pending at the partition's committed offset, before writing them."""
        from confluent_kafka import TopicPartition

        metadata = format_journal(ranges)
        if len(metadata) > JOURNAL_MAX_CHARS:
            raise JournalMismatch(f"{state.kafka_topic}[{state.partition}]: too many uncommitted ranges ({len(ranges)})")
        tp = TopicPartition(state.kafka_topic, state.partition, ranges[0][0], metadata)
        self.consumer.commit(offsets=[tp], asynchronous=False)  # raises: the batcher retries the write
        state.pending = list(ranges)

    def _commit(self, state: _Partition, done: Sequence[tuple[str, int, int]]) -> None:
        """Commit the next offset of a partition whose rows are durable (dead letters delivered first)."""
        from confluent_kafka import KafkaException, TopicPartition

        if not done:
            return
        next_offset = max(n for _, _, n in done)
        self._deliver_dead_letters()
        remaining = [r for r in state.pending if r[1] >= next_offset]
        tp = TopicPartition(state.kafka_topic, state.partition, next_offset, format_journal(remaining))
        try:
            self.consumer.commit(offsets=[tp], asynchronous=False)
        except KafkaException as exc:
            # like a crash before the commit: the journal makes the redelivery rewrite the same ranges
            self.stats.commit_failures += 1
            log.warning("%s[%d]: commit of offset %d failed: %s", state.kafka_topic, state.partition, next_offset, exc)
            return
        state.pending = remaining
        state.committed = next_offset
        self.stats.commits += 1

    # --- dead letters ----------------------------------------------------------------------------
    def _produce_dead_letters(self, dead: list[DeadLetter]) -> None:
        for record in dead:
            self.producer.produce(self.dead_letter_topic, key=record.request_id.encode(), value=encode(record),
                                  on_delivery=self._dead_letter_delivered)
            self._dead_letters_unflushed += 1
            self.stats.dead_letters += 1
        self.producer.poll(0)

    def _dead_letter_delivered(self, err: Any, message: Any) -> None:
        if err is not None:
            self._dead_letter_errors.append(str(err))

    def _deliver_dead_letters(self, timeout: float = 30.0) -> None:
        """Dead letters must be in Kafka before the offsets of their poison messages are committed."""
        if not self._dead_letters_unflushed:
            return
        remaining = self.producer.flush(timeout)
        if remaining or self._dead_letter_errors:
            errors, self._dead_letter_errors = self._dead_letter_errors, []
            raise RuntimeError(f"dead letters not delivered ({remaining} pending; {errors[:3]}); not committing past them")
        self._dead_letters_unflushed = 0


# --- the two sinks ----------------------------------------------------------------------------------
class PrefixedClickHouseTarget:
    """``ClickHouseSink.write`` with the topic prefix in the deduplication token.

    Tokens name ``topic/partition/first-last``; two prefixes (tenants) sharing one database would
    otherwise produce equal tokens for different rows, and ClickHouse would silently drop the
    second tenant's batch as a "duplicate".
    """

    isolates_poison = True  # on_poison is passed through to ClickHouseSink.insert

    def __init__(self, sink: Any, prefix: str) -> None:
        self.sink = sink
        self.prefix = prefix

    def write(self, topic: str, partition: int, first_offset: int, last_offset: int, records: Sequence[Event],
              on_poison: Callable[[int, Event, str], None] | None = None) -> int:
        return self.sink.insert(topic, [(partition, first_offset, last_offset)], records, token_prefix=self.prefix,
                                on_poison=on_poison)


def clickhouse_sink_consumer(settings: Settings, **options: Any) -> KafkaSinkConsumer:
    """Every topic of the registry into its ClickHouse table (migrations applied first)."""
    from entroloop.contract.topics import TOPICS
    from entroloop.infra.clickhouse.client import connect
    from sinks.clickhouse.writer import ClickHouseSink

    from entroloop.infra.quarantine import quarantine_from_settings

    client = connect(settings.resolved_clickhouse_dsn(), settings.clickhouse_password.get_secret_value())
    # dead letters' raw bytes go to the write-once quarantine beside the audit log, never to the table
    sink = ClickHouseSink(client, settings.clickhouse_database, quarantine=quarantine_from_settings(settings))
    target = PrefixedClickHouseTarget(sink, settings.topic_prefix) if settings.topic_prefix else sink
    return KafkaSinkConsumer("clickhouse", target, [t.name for t in TOPICS], settings, **options)


def audit_sink_consumer(settings: Settings, create_bucket: bool = False, **options: Any) -> KafkaSinkConsumer:
    """The audit and actions topics into write-once Parquet files with hash-chained manifests
    (one chain per topic partition, so audit and action records never share a chain)."""
    from entroloop.infra.worm.stores import open_worm_store
    from sinks.audit.checkpointer import checkpointer_from_settings
    from sinks.audit.parquet_writer import AuditParquetWriter

    options.setdefault("max_rows", settings.audit_batch_records)
    worm = open_worm_store(settings, create_bucket=create_bucket)
    target = AuditParquetWriter(worm, checkpointer=checkpointer_from_settings(settings, worm))
    return KafkaSinkConsumer("audit", target, target.topics, settings, **options)


SINK_FACTORIES: dict[str, Callable[..., KafkaSinkConsumer]] = {
    "clickhouse": clickhouse_sink_consumer,
    "audit": audit_sink_consumer,
}

__all__ = [
    "BrokerUnreachable",
    "KafkaSinkConsumer",
    "SINK_FACTORIES",
    "SinkStats",
    "audit_sink_consumer",
    "clickhouse_sink_consumer",
    "fault_kill_after_write",
    "format_journal",
    "parse_journal",
]
