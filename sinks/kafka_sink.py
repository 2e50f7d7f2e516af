"""Sinks as Kafka consumers: decode, batch per (topic, partition), write durably, then commit.

One ``KafkaSinkConsumer`` drives one durable target (``ClickHouseSink`` or ``AuditParquetWriter``,
anything with ``write(topic, partition, first_offset, last_offset, records)``) from a consumer
group of its own (``<prefix>entroloop-sink-<kind>``), with ``enable.auto.commit=false``:

* Each message is decoded with ``entroloop.contract.codec``; a poison message (or a record of the wrong
  kind for its topic) becomes a ``DeadLetter`` produced to the dead-letter topic with its reason,
  and the producer is flushed before any offset past it is committed. The consumer never crashes
  on bad bytes.
* One ``entroloop.sinks.batching.SinkBatcher`` serves every assigned partition: a table's rows from all its
  partitions accumulate into one write per flush interval (``max_rows`` or ``max_seconds``,
  counted from the oldest row's broker timestamp, so time spent in Kafka counts), about one
  insert per table per second at steady state instead of one per partition. A write covers one
  contiguous offset range of each partition in it, and its idempotency key (ClickHouse's
  ``insert_deduplication_token``) names every range. The audit log keeps one hash chain per
  partition, so its target gets one partition per write (its object keys name that range).
* Offsets are committed synchronously, next offset per partition, only after the write returned;
  the offsets of all partitions a flush wrote go in one commit request.
* A record the target refuses on its own (``ClickHouseSink`` bisects a failed insert and reports
  each such record with ClickHouse's error) becomes a dead letter (``insert_rejected``) like a
  poison message, and the rest of its batch is stored: one bad row never stops the partition.

**Why a write journal.** A batch closed by the clock (``max_seconds``), by shutdown, or holding
whatever partitions happened to have rows, is cut differently when it is read again after a crash,
and a different token means a second copy of the rows (or a second audit file). So before it
writes a batch the consumer commits each of the batch's partitions at its *current* offset again,
all in one request, with the pending range and the batch's members in the commit metadata
(``entroloop-pending:F-L[@P:F-L+P:F-L...][,...]``, see ``format_journal``). After a crash between
write and commit, the next owner of a partition reads that metadata from the group's committed
offsets, and its first write of those offsets rewrites each pending batch whole, exactly as
journaled: members it holds come from its buffer, members it does not (another sink owns that
partition now, or the cut left it out) are read again from Kafka. Same members, same token, so
ClickHouse drops the repeat and the audit writer recognises its batch; two owners replaying one
batch both use its token. The journal lives in Kafka itself (no extra store), costs one
synchronous commit per flush, and works across processes and rebalances because the metadata
travels with the partition's offset.

**Backpressure.** A batcher that is full raises ``SinkBackpressure`` before taking anything; the
consumer pauses that partition, seeks it back to the first offset it did not take and keeps polling
(so the group does not rebalance) and flushing; it resumes the partition when the batcher has
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

from entroloop.sinks.batching import SinkBatcher, Slice

from entroloop.contract.codec import (
    CodecError,
    EventTimeWindow,
    dead_letter_at,
    decode_many,
    encode,
)
from entroloop.contract.records import DeadLetter, Event
from entroloop.contract.settings import Settings
from entroloop.contract.topics import TOPIC_BY_NAME
from entroloop.infra.kafka_consumer_config import manual_commit_consumer_config
from entroloop.infra.metrics import (
    DEAD_LETTERS,
    EVENTS_IN,
    EVENTS_OUT,
    INSERT_SECONDS,
    mark_commit,
)

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
Member = tuple[int, int, int]  # (partition, first offset, last offset) of one write
Batch = tuple[Member, ...]  # every partition range one write covers, sorted by partition
# a batch's members are spelled out in the journal of each of its partitions; this many keep even a
# chain of two pending batches well inside JOURNAL_MAX_CHARS (~25 characters per member)
MAX_BATCH_PARTITIONS = 48


@dataclass(frozen=True)
class Pending:
    """A range of one partition that is written (or about to be) and not yet committed, and the
    whole batch it was written in (the same batch is rewritten after a crash: same token)."""

    first: int
    last: int
    batch: Batch


def format_journal(pending: Sequence[Pending]) -> str:
    """``entroloop-pending:F-L[@P:F-L+P:F-L...],...``; a batch of this partition alone has no ``@``
    part (the format of sinks that wrote one batch per partition, still read the same way)."""
    if not pending:
        return ""
    parts = []
    for p in pending:
        members = "" if len(p.batch) == 1 else "@" + "+".join(f"{q}:{f}-{l}" for q, f, l in p.batch)
        parts.append(f"{p.first}-{p.last}{members}")
    return JOURNAL_TAG + ",".join(parts)


def _parse_range(text: str) -> Range | None:
    first, sep, last = text.partition("-")
    if not (sep and first.isdigit() and last.isdigit()):
        return None
    return int(first), int(last)


def parse_journal(metadata: str | None, committed_offset: int, partition: int) -> list[Pending]:
    """Pending ranges of ``partition`` recorded at ``committed_offset`` (ranges below it are done;
    junk is ignored)."""
    if not metadata or not metadata.startswith(JOURNAL_TAG):
        return []
    pending: list[Pending] = []
    for part in metadata[len(JOURNAL_TAG):].split(","):
        own, _, members = part.partition("@")
        bounds = _parse_range(own)
        if bounds is None:
            return []
        batch: list[Member] = []
        for member in members.split("+") if members else []:
            p, sep, text = member.partition(":")
            mr = _parse_range(text)
            if not (sep and p.isdigit() and mr):
                return []
            batch.append((int(p), *mr))
        if not batch:
            batch = [(partition, *bounds)]
        if (partition, *bounds) not in batch:
            return []  # a batch that does not name this range: not ours to trust
        pending.append(Pending(bounds[0], bounds[1], tuple(sorted(batch))))
    pending = [p for p in pending if p.last >= committed_offset]
    # the journal is a chain of consecutive ranges starting at the committed offset
    expected = committed_offset
    for p in pending:
        if p.first != expected or p.last < p.first:
            return []
        expected = p.last + 1
    return pending


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
    writes_by_topic: dict[str, int] = field(default_factory=dict)
    journals: int = 0
    # wall-clock seconds spent in the journal commits, the target's writes and the offset commits
    stage_seconds: dict[str, float] = field(default_factory=lambda: {"journal": 0.0, "write": 0.0, "commit": 0.0})
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
        out["writes_by_topic"] = dict(self.writes_by_topic)
        out["stage_seconds"] = {k: round(v, 3) for k, v in self.stage_seconds.items()}
        return out


@dataclass
class _Partition:
    """What the consumer knows about one assigned partition."""

    kafka_topic: str
    topic: str  # the registry name (targets look tables and keys up by it)
    partition: int
    expected: int | None = None  # next offset to take
    committed: int | None = None  # the group's committed offset (where a journal must start)
    pending: list[Pending] = field(default_factory=list)  # written or about to be, not yet committed
    paused: bool = False
    eof: bool = False


class _BatchWriter:
    """The batcher's target: journals the cuts of every due topic for all their partitions at once,
    then writes each."""

    def __init__(self, sink: KafkaSinkConsumer) -> None:
        self.sink = sink

    def prepare(self, cuts: dict[str, Sequence[Slice]]) -> None:
        self.sink._prepare(cuts)

    def write_slices(self, topic: str, slices: Sequence[Slice]) -> int:
        return self.sink._write_slices(topic, slices)


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
        buffer_rows: int | None = None,
        session_timeout_s: float = 30.0,
        consumer_config: dict[str, Any] | None = None,
    ) -> None:
        from confluent_kafka import Consumer, Producer

        self.kind = kind
        self._component = f"sink-{kind}"  # the `component` label of its Prometheus metrics
        self.target = target
        self.settings = settings
        self.prefix = settings.topic_prefix
        self.topics = list(topics)
        for name in self.topics:
            if name not in TOPIC_BY_NAME:
                raise ValueError(f"unknown topic {name!r}")
        self.max_rows = max_rows or settings.sink_batch_rows
        self.max_seconds = max_seconds or settings.sink_batch_seconds
        # rows buffered across all partitions and tables before partitions are paused
        self.buffer_rows = max(buffer_rows or 4 * self.max_rows, self.max_rows)
        self.group_id = f"{self.prefix}entroloop-sink-{kind}"
        config = manual_commit_consumer_config(
            settings, group_id=self.group_id, client_id=f"entroloop-sink-{kind}",
            logger_name="entroloop.sinks.kafka.librdkafka", session_timeout_s=session_timeout_s,
            **{"max.poll.interval.ms": 300_000},
        )
        config.update(consumer_config or {})
        self._consumer_config = config
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
        # one batcher for every partition: a table's rows of all partitions go into one write
        self._batcher = SinkBatcher(_BatchWriter(self), max_rows=self.max_rows, max_seconds=self.max_seconds,
                                    max_buffered_rows=self.buffer_rows)
        # several partitions per write only where the target takes them (ClickHouse); the audit
        # log keeps one hash chain per partition, so each of its writes covers one partition
        self._multi_partition = hasattr(target, "write_slices")
        self._written: set[tuple[str, Batch]] = set()  # batches written by this process, not yet committed
        self._from_journal: set[tuple[str, Batch]] = set()  # batches a crashed owner left pending
        self._planned: dict[str, tuple[Sequence[Slice], Any]] = {}  # cuts journaled by _prepare, to write
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
                # wait no longer than until the next batch is due (its clock runs from the broker's append)
                wait = min(poll_s, max(0.0, self._batcher.next_due_in()))
                messages = self.consumer.consume(num_messages=10_000, timeout=wait)
                # idle means nothing to do: paused partitions and unwritten rows are work waiting
                busy = self._batcher.buffered_rows or any(st.paused for st in self._states.values())
                if self._take(messages) or busy:
                    last_message = time.monotonic()
                self._flush(force=False)
                self._resume_drained()
                if until_empty:
                    if self._drained():
                        self._flush(force=True)
                        idle = not self._batcher.buffered_rows
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

        if not self._states or not all(s.eof and not s.paused for s in self._states.values()):
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
    def _on_assign(self, consumer: Any, partitions: list[Any]) -> None:
        self.stats.rebalances += 1
        log.info("assigned %d partition(s)", len(partitions))
        for tp in partitions:
            self._states[(tp.topic, tp.partition)] = _Partition(tp.topic, tp.topic[len(self.prefix):], tp.partition)
        try:
            committed = consumer.committed(partitions, timeout=30)
        except Exception as exc:
            raise RuntimeError(f"cannot read committed offsets of {len(partitions)} partitions: {exc}") from exc
        for tp in committed:
            state = self._states[(tp.topic, tp.partition)]
            if tp.offset >= 0:
                state.expected = state.committed = tp.offset
                state.pending = parse_journal(tp.metadata, tp.offset, tp.partition)
                if state.pending:
                    # written (or about to be) before a crash: the first write of these offsets
                    # rewrites each of these batches whole, under its own token (``_write_slices``)
                    self._from_journal.update((state.topic, p.batch) for p in state.pending)
                    log.warning("%s[%d]: rewriting %d batch(es) written before a crash: %s", tp.topic, tp.partition,
                                len(state.pending), [p.batch for p in state.pending])

    def _on_revoke(self, consumer: Any, partitions: list[Any]) -> None:
        self.stats.rebalances += 1
        if any((tp.topic, tp.partition) in self._states for tp in partitions):
            # still ours: write what is buffered and commit it, so the next owner starts clean
            self._commit(self._batcher.flush_all())
        self._forget(partitions)

    def _on_lost(self, consumer: Any, partitions: list[Any]) -> None:
        # no longer ours: committing would fail and writing could race the new owner; forget it
        self._forget(partitions)

    def _forget(self, partitions: list[Any]) -> None:
        for tp in partitions:
            state = self._states.pop((tp.topic, tp.partition), None)
            if state:
                self.stats.dropped_on_revoke += self._batcher.drop_partition(state.topic, state.partition)

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

    def _decode(self, topic: str, messages: list[Any], dead_letters_for: _Partition | None
                ) -> tuple[list[tuple[int, Event]], list[DeadLetter]]:
        pairs: list[tuple[int, Event]] = []
        dead: list[DeadLetter] = []
        record_type = TOPIC_BY_NAME[topic].record_type
        values = [message.value() or b"" for message in messages]
        # one batch decode (the collector paused for it); each item is a record or its CodecError
        for message, value, record in zip(messages, values, decode_many(values, self.settings.max_record_bytes, self._time_window)):
            if not isinstance(record, CodecError) and not isinstance(record, record_type):
                record = CodecError(f"a {type(record).__name__} record on topic {topic}")
                record.error_type = "wrong_topic"
            if isinstance(record, CodecError):
                if dead_letters_for is not None:
                    dead.append(self._dead_letter(dead_letters_for, message, value, record))
                continue
            pairs.append((message.offset(), record))
        return pairs, dead

    def _dead_letter(self, state: _Partition, message: Any, value: bytes, err: CodecError) -> DeadLetter:
        """Same id as the embedded runner's and the Faust worker's: a redelivery repeats the id."""
        return dead_letter_at(state.topic, state.partition, message.offset(), key=message.key(), payload=value,
                              error=err, node_id=f"sink-{self.kind}")

    @staticmethod
    def _appended_at(messages: list[Any]) -> float | None:
        """The oldest broker timestamp of ``messages`` in seconds (None where the broker gave none)."""
        stamps = [ms for kind, ms in (m.timestamp() for m in messages) if kind != 0 and ms >= 0]
        return min(stamps) / 1000.0 if stamps else None

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
        pairs, dead = self._decode(state.topic, messages, state)
        if self.stats.first_message is None:
            self.stats.first_message = time.monotonic()
        self.stats.messages += len(messages)
        self.stats.records += len(pairs)
        EVENTS_IN.labels(self._component, state.topic).inc(len(messages))

        room = self._batcher.max_buffered_rows - self._batcher.buffered_rows
        if len(pairs) > room:
            # take what fits, pause at the first record left out (fetched again after resume)
            cut = pairs[room][0]
            pairs = pairs[:room]
            dead = [d for d in dead if d.source_offset < cut]
            if cut > first:
                taken = [m for m in messages if m.offset() < cut]
                self._take_range(state, first, cut - 1, pairs, dead, self._appended_at(taken))
            self._pause(state, cut)
            return
        self._take_range(state, first, last, pairs, dead, self._appended_at(messages))

    def _take_range(self, state: _Partition, first: int, last: int, pairs: list[tuple[int, Event]],
                    dead: list[DeadLetter], appended_at: float | None) -> None:
        self._produce_dead_letters(dead)
        state.expected = last + 1
        if not pairs and not self._batcher.partition_rows(state.topic, state.partition) and not state.pending:
            # only poison here and nothing buffered before it: commit past it once it is delivered
            self._commit([(state.topic, state.partition, last + 1)])
            return
        self._batcher.add(state.topic, state.partition, first, last, pairs, appended_at=appended_at)

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
                 self._batcher.buffered_rows, f", last error {self._batcher.last_error}" if self._batcher.last_error else "",
                 offset)

    def _resume_drained(self) -> None:
        from confluent_kafka import TopicPartition

        for state in self._states.values():
            if state.paused and self._batcher.has_room(self.max_rows):
                self.consumer.resume([TopicPartition(state.kafka_topic, state.partition)])
                state.paused = False

    # --- writing and committing ------------------------------------------------------------------
    def _flush(self, force: bool) -> None:
        if self._batcher.buffered_rows:
            self._commit(self._batcher.flush_all() if force else self._batcher.flush_due())

    def _prepare(self, cuts: dict[str, Sequence[Slice]]) -> None:
        """Plan every due topic's cut and journal all their new batches in one commit (one round
        trip per flush, not one per table); ``_write_slices`` then writes each cut as planned."""
        plans = {topic: self._plan(topic, slices) for topic, slices in cuts.items()}
        self._journal({topic: [batch for batch, _ in plan] for topic, plan in plans.items()})
        self._planned = {topic: (cuts[topic], plan) for topic, plan in plans.items()}

    def _plan(self, topic: str, slices: Sequence[Slice]) -> list[tuple[Batch, list[tuple[Member, list[tuple[int, Event]]]]]]:
        """The new batches of a cut: each slice after its partition's pending chain (the chain is
        rewritten first by ``_write_slices``), at most ``MAX_BATCH_PARTITIONS`` partitions a batch
        (one where the target takes one partition per write)."""
        kafka_topic = self.prefix + topic
        new: list[tuple[Member, list[tuple[int, Event]]]] = []
        for s in slices:
            state = self._states[(kafka_topic, s.partition)]
            chain_end = state.pending[-1].last + 1 if state.pending else state.committed
            cursor = max(s.first, state.pending[-1].last + 1) if state.pending else s.first
            if cursor > s.last:
                continue
            pairs = [(o, r) for o, r in s.records if o >= cursor]
            if not pairs:
                continue  # nothing but poison left: the commit after this write covers it
            # the journal is a chain from the committed offset: a range starts where the chain ends
            # (offsets skipped before it held only poison, already dead-lettered)
            start = cursor if chain_end is None else min(cursor, chain_end)
            new.append(((s.partition, start, s.last), pairs))
        step = MAX_BATCH_PARTITIONS if self._multi_partition else 1
        groups = [new[i:i + step] for i in range(0, len(new), step)]
        return [(tuple(m for m, _ in g), g) for g in groups]

    def _write_slices(self, topic: str, slices: Sequence[Slice]) -> int:
        """Write one cut of ``topic`` (one slice per partition): first every pending batch of these
        partitions not yet written by this process, exactly as journaled (a crash or a failed write
        left it; same members, same token), then the rest of the cut as new batches, journaled for
        all their partitions (by ``_prepare`` with the other due topics, or here) before they are
        written."""
        kafka_topic = self.prefix + topic
        by_partition = {s.partition: s for s in slices}
        planned_slices, plan = self._planned.pop(topic, (None, None))
        if planned_slices is not slices or plan is None:
            plan = self._plan(topic, slices)
            self._journal({topic: [batch for batch, _ in plan]})
        new = {batch for batch, _ in plan}
        written = 0
        states = [self._states[(kafka_topic, s.partition)] for s in slices]
        for batch in dict.fromkeys(p.batch for st in states for p in st.pending):
            if (topic, batch) not in self._written and batch not in new:
                members = [(m, self._member_pairs(kafka_topic, m, by_partition.get(m[0]))) for m in batch]
                written += self._write_batch(topic, batch, members, replay=(topic, batch) in self._from_journal)
        for batch, members in plan:
            written += self._write_batch(topic, batch, members, replay=False)
        return written

    def _member_pairs(self, kafka_topic: str, member: Member, s: Slice | None) -> list[tuple[int, Event]]:
        """The records of one member of a pending batch: from the buffered slice when it holds the
        whole range, else read again from Kafka (a partition of the batch left out of this cut, or
        now owned by another sink, which rewrites the same batch under the same token)."""
        partition, first, last = member
        if s is not None and s.first <= first and s.last >= last:
            return [(o, r) for o, r in s.records if first <= o <= last]
        return self._read_range(kafka_topic, partition, first, last)

    def _read_range(self, kafka_topic: str, partition: int, first: int, last: int, timeout: float = 60.0
                    ) -> list[tuple[int, Event]]:
        """Offsets ``first..last`` of one partition, read with a consumer of no group (poison is
        skipped: its owner dead-letters it)."""
        from confluent_kafka import Consumer, KafkaError, TopicPartition

        reader = Consumer({**self._consumer_config, "group.id": f"{self.group_id}-replay",
                           "client.id": f"entroloop-sink-{self.kind}-replay", "enable.partition.eof": True})
        messages: list[Any] = []
        try:
            reader.assign([TopicPartition(kafka_topic, partition, first)])
            deadline, reached = time.monotonic() + timeout, first - 1
            while reached < last and time.monotonic() < deadline:
                for m in reader.consume(num_messages=10_000, timeout=0.5):
                    if m.error() is not None:
                        if m.error().code() == KafkaError._PARTITION_EOF:
                            raise RuntimeError(f"{kafka_topic}[{partition}] ends before offset {last}")
                        continue
                    reached = max(reached, m.offset())
                    if first <= m.offset() <= last:
                        messages.append(m)
            if reached < last:
                raise TimeoutError(f"could not read {kafka_topic}[{partition}] {first}-{last} within {timeout:.0f} s")
        finally:
            reader.close()
        return self._decode(kafka_topic[len(self.prefix):], messages, None)[0]

    def _write_batch(self, topic: str, batch: Batch, members: Sequence[tuple[Member, list[tuple[int, Event]]]],
                     replay: bool) -> int:
        """One write of the journaled ``batch``: ``members`` holds each member's ``(offset, record)``
        pairs; returns rows stored."""
        members = [(m, pairs) for m, pairs in members if pairs]
        if not members:
            self._written.add((topic, batch))
            return 0
        started = time.perf_counter()
        refused = self._target_write(topic, members, replay)
        took = time.perf_counter() - started
        self.stats.stage_seconds["write"] += took
        INSERT_SECONDS.labels(f"{self.kind}:{topic}").observe(took)
        rows = sum(len(p) for _, p in members) - refused
        EVENTS_OUT.labels(self._component, topic).inc(rows)
        self.stats.writes += 1
        self.stats.writes_by_topic[topic] = self.stats.writes_by_topic.get(topic, 0) + 1
        self.stats.rows_written += rows
        if replay:
            self.stats.replayed_ranges += len(batch)
            self.stats.replayed_rows += rows
        self._written.add((topic, batch))
        _after_durable_write(f"{topic} {format_journal([Pending(batch[0][1], batch[0][2], batch)])}")
        return rows

    def _target_write(self, topic: str, members: Sequence[tuple[Member, list[tuple[int, Event]]]],
                      replay: bool = False) -> int:
        """Write one batch; records the target refuses on their own are produced as dead letters.

        Returns how many were refused. The dead letters are flushed before any offset past them is
        committed (``_commit``). A ``replay`` (a batch a crashed owner journaled) is then handed to
        the target's ``repair_replay`` where it has one (ClickHouse: a crash of the database itself
        may have logged the batch's token and lost its rows).
        """
        located = [(m[0], o, r) for m, pairs in members for o, r in pairs]  # (partition, offset, record)
        slices = [Slice(m[0], m[1], m[2], [r for _, r in pairs]) for m, pairs in members]
        isolates = getattr(self.target, "isolates_poison", False)
        refused_at: set[int] = set()

        def dead_letter(index: int, record: Event, reason: str) -> None:
            refused_at.add(index)
            partition, offset, _ = located[index]
            err = CodecError(f"ClickHouse refused the record: {reason}")
            err.error_type = "insert_rejected"
            letter = dead_letter_at(topic, partition, offset, key=record.request_id, payload=encode(record),
                                    error=err, node_id=f"sink-{self.kind}")
            log.warning("%s[%d] offset %d: dead-lettered, %s", self.prefix + topic, partition, offset, err.reason[:300])
            self._produce_dead_letters([letter])

        poison = {"on_poison": dead_letter} if isolates else {}
        if self._multi_partition:
            self.target.write_slices(topic, slices, **poison)  # type: ignore[attr-defined]
        else:
            (s,) = slices
            self.target.write(topic, s.partition, s.first, s.last, s.records, **poison)
        repair = getattr(self.target, "repair_replay", None)
        if replay and repair is not None:
            repair(topic, [(s.partition, s.first, s.last) for s in slices],
                   [r for i, (_, _, r) in enumerate(located) if i not in refused_at])
        return len(refused_at)

    def _journal(self, batches: dict[str, list[Batch]]) -> None:
        """Record each batch (per topic) as pending on every partition it covers, all in one commit,
        before any of them is written."""
        from confluent_kafka import TopicPartition

        chains: dict[tuple[str, int], list[Pending]] = {}
        for topic, topic_batches in batches.items():
            for batch in topic_batches:
                for partition, first, last in batch:
                    key = (self.prefix + topic, partition)
                    chains.setdefault(key, list(self._states[key].pending)).append(Pending(first, last, batch))
        if not chains:
            return
        offsets = []
        for (kafka_topic, partition), chain in chains.items():
            metadata = format_journal(chain)
            if len(metadata) > JOURNAL_MAX_CHARS:
                raise JournalMismatch(f"{kafka_topic}[{partition}]: too many uncommitted ranges ({len(chain)})")
            offsets.append(TopicPartition(kafka_topic, partition, chain[0].first, metadata))
        started = time.perf_counter()
        self.consumer.commit(offsets=offsets, asynchronous=False)  # raises: the batcher retries the write
        self.stats.stage_seconds["journal"] += time.perf_counter() - started
        self.stats.journals += 1
        for key, chain in chains.items():
            self._states[key].pending = chain

    def _commit(self, done: Sequence[tuple[str, int, int]]) -> None:
        """Commit the next offsets of partitions whose rows are durable, all in one request (dead
        letters delivered first). A partition no longer ours is skipped: its next owner replays."""
        from confluent_kafka import KafkaException, TopicPartition

        if not done:
            return
        next_offsets: dict[tuple[str, int], int] = {}
        for topic, partition, offset in done:
            key = (self.prefix + topic, partition)
            next_offsets[key] = max(offset, next_offsets.get(key, offset))
        self._deliver_dead_letters()
        offsets, updates = [], []
        for key, next_offset in next_offsets.items():
            state = self._states.get(key)
            if state is None or (state.committed is not None and next_offset < state.committed):
                continue
            # never into the middle of a pending range: the journal must stay a chain from the commit
            next_offset = min([next_offset, *(p.first for p in state.pending if p.first < next_offset <= p.last)])
            remaining = [p for p in state.pending if p.last >= next_offset]
            offsets.append(TopicPartition(key[0], key[1], next_offset, format_journal(remaining)))
            updates.append((state, next_offset, remaining))
        if not offsets:
            return
        started = time.perf_counter()
        try:
            self.consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            # like a crash before the commit: the journal makes the redelivery rewrite the same batches
            self.stats.commit_failures += 1
            log.warning("commit of %d partition(s) failed: %s", len(offsets), exc)
            return
        finally:
            self.stats.stage_seconds["commit"] += time.perf_counter() - started
        for state, next_offset, remaining in updates:
            state.pending = remaining
            state.committed = next_offset
        self.stats.commits += 1
        mark_commit(self._component)
        still_pending = {(s.topic, p.batch) for s in self._states.values() for p in s.pending}
        self._written &= still_pending
        self._from_journal &= still_pending

    # --- dead letters ----------------------------------------------------------------------------
    def _produce_dead_letters(self, dead: list[DeadLetter]) -> None:
        for record in dead:
            self.producer.produce(self.dead_letter_topic, key=record.request_id.encode(), value=encode(record),
                                  on_delivery=self._dead_letter_delivered)
            self._dead_letters_unflushed += 1
            self.stats.dead_letters += 1
            DEAD_LETTERS.labels(self._component, record.source_topic).inc()
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

    def write_slices(self, topic: str, slices: Sequence[Slice],
                     on_poison: Callable[[int, Event, str], None] | None = None) -> int:
        slices = [s for s in slices if s.records]
        return self.sink.insert(topic, [(s.partition, s.first, s.last) for s in slices],
                                [r for s in slices for r in s.records], token_prefix=self.prefix, on_poison=on_poison)

    def repair_replay(self, topic: str, ranges: Sequence[tuple[int, int, int]], stored: Sequence[Event]) -> int:
        return self.sink.repair_replay(topic, ranges, stored, token_prefix=self.prefix)


def clickhouse_sink_consumer(settings: Settings, **options: Any) -> KafkaSinkConsumer:
    """Every topic of the registry into its ClickHouse table (migrations applied first)."""
    from entroloop.sinks.clickhouse.writer import ClickHouseSink

    from entroloop.contract.topics import TOPICS
    from entroloop.infra.clickhouse.client import connect
    from entroloop.infra.quarantine import quarantine_from_settings

    client = connect(settings.resolved_clickhouse_dsn(), settings.clickhouse_password.get_secret_value())
    # dead letters' raw bytes go to the write-once quarantine beside the audit log, never to the table
    sink = ClickHouseSink(client, settings.clickhouse_database, quarantine=quarantine_from_settings(settings),
                          embedded=settings.resolved_clickhouse_dsn().startswith("chdb://"))
    target = PrefixedClickHouseTarget(sink, settings.topic_prefix) if settings.topic_prefix else sink
    return KafkaSinkConsumer("clickhouse", target, [t.name for t in TOPICS], settings, **options)


def audit_sink_consumer(settings: Settings, create_bucket: bool = False, **options: Any) -> KafkaSinkConsumer:
    """The audit and actions topics into write-once Parquet files with hash-chained manifests
    (one chain per topic partition, so audit and action records never share a chain)."""
    from entroloop.sinks.audit.checkpointer import checkpointer_from_settings
    from entroloop.sinks.audit.parquet_writer import AuditParquetWriter

    from entroloop.infra.worm.stores import open_worm_store

    options.setdefault("max_rows", settings.audit_batch_records)
    worm = open_worm_store(settings, create_bucket=create_bucket)
    target = AuditParquetWriter(worm, checkpointer=checkpointer_from_settings(settings, worm))
    return KafkaSinkConsumer("audit", target, target.topics, settings, **options)


SINK_FACTORIES: dict[str, Callable[..., KafkaSinkConsumer]] = {
    "clickhouse": clickhouse_sink_consumer,
    "audit": audit_sink_consumer,
}

__all__ = [
    "SINK_FACTORIES",
    "BrokerUnreachable",
    "KafkaSinkConsumer",
    "SinkStats",
    "audit_sink_consumer",
    "clickhouse_sink_consumer",
    "fault_kill_after_write",
    "format_journal",
    "parse_journal",
]
