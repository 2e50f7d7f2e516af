"""The serving node's Kafka publisher: never blocks the caller, never loses a record silently.

``publish(record)`` appends the record to a bounded in-memory queue and returns (a deque append: no
lock, no encoding, no I/O). A daemon thread encodes the queued records and hands them to a
confluent-kafka (librdkafka) producer with ``acks=all``, idempotence, compression and batching.

When the broker is unreachable (all brokers down, or deliveries failing / timing out), records go
to a local append-only spool file (``entroloop.collectors.spool``) and are replayed in order once a
metadata probe reaches the broker again. While the spool holds anything, new records are appended
behind it, and records librdkafka held unsent when the outage began are purged back into the spool
first, so replay keeps each key's publish order (records already in flight when the broker vanished
are spooled when they time out; they may also have landed: at-least-once, deduplicated by event_id).
A topic that librdkafka's metadata does not hold (just created and not yet seen by the broker that
answered, or not created yet) is handled the same way: its records wait in the spool, they are not
dropped. If the queue is full (the thread cannot keep up), the caller's record goes straight to
the spool. A record is dropped only when the spool has reached its disk limit; that is counted
(``dropped``) and logged as an error.

The broker refuses batches, not records: one record over a topic's ``max.message.bytes`` fails
every record librdkafka batched with it. So a refusal is not a verdict on a record until the record
was sent alone: refused records are spooled, and the replay sends each one that is refused again in
a batch of its own. One still refused then (or one ``produce()`` refuses outright) is refused for
good: it is kept with the reason in ``<spool folder>/rejected/`` (``collectors/rejected.py``), a
``DeadLetter`` says so on the dead-letter topic, and the spool moves past it, so one such record
never holds up the records behind it.

Counters (``stats()``): ``sent`` (delivered live), ``spooled``, ``replayed``
(delivered from the spool), ``failed`` (refused for good, kept in ``rejected/``: logged),
``dropped``, ``delivery_errors`` (failures that were spooled to be retried), plus the gauges
``queued`` and ``spool_bytes``.

Fork-safe (``os.register_at_fork``): a forked child gets its own empty queue, its own producer,
thread and spool file; the parent's librdkafka handle is never touched in the child.

Topic: the record class's topic (``entroloop.contract.topics``) with ``Settings.topic_prefix`` in
front; key: ``request_id``. Partitioner ``consistent_random`` = CRC32 of the key, as
``entroloop.contract.topics.partition_for``.
"""

from __future__ import annotations

import atexit
import collections
import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from entroloop.collectors.rejected import RejectedRecords
from entroloop.collectors.spool import (
    FsyncPolicy,
    Spool,
    SpooledMessage,
    SpoolFull,
    SpoolLocked,
    orphan_spools,
)
from entroloop.contract import codec
from entroloop.contract.ids import derived_event_id
from entroloop.contract.records import DeadLetter, Event
from entroloop.contract.settings import Settings
from entroloop.infra.log_throttle import LogThrottle
from entroloop.infra.private_files import make_private_dir

log = logging.getLogger(__name__)
librdkafka_log = logging.getLogger(__name__ + ".librdkafka")


class _RepeatFilter(logging.Filter):
    """librdkafka logs every failed reconnect (ten a second in an outage): let one line of each
    kind through per ``interval`` seconds; the publisher says what matters itself."""

    def __init__(self, interval: float = 30.0) -> None:
        super().__init__()
        self.interval = interval
        self._last: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        kind = record.getMessage().split(" ", 1)[0]  # the librdkafka facility (FAIL, ...)
        now = time.monotonic()
        if now - self._last.get(kind, -self.interval) < self.interval:
            return False
        self._last[kind] = now
        return True


librdkafka_log.addFilter(_RepeatFilter())

# librdkafka error codes that mean "the broker (not this record) is the problem": spool and retry.
_TRANSIENT_CODES = {
    KafkaError._MSG_TIMED_OUT,
    KafkaError._TIMED_OUT,
    KafkaError._TRANSPORT,
    KafkaError._ALL_BROKERS_DOWN,
    KafkaError._PURGE_QUEUE,
    KafkaError._PURGE_INFLIGHT,
    KafkaError.NOT_ENOUGH_REPLICAS,
    KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
    KafkaError.REQUEST_TIMED_OUT,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.NETWORK_EXCEPTION,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._UNKNOWN_PARTITION,
    # The client's metadata does not hold the topic (yet): right after CreateTopics it may not
    # have reached the broker that answered (librdkafka #2858, #4904), or the operator has still to
    # create it. The record is fine; it waits in the spool until the topic is there.
    KafkaError._UNKNOWN_TOPIC,
    KafkaError._DESTROY,
    # A fatal (idempotent) producer error makes every later produce() fail: that says nothing about
    # the records, which wait in the spool for a restarted publisher instead of being refused.
    KafkaError._FATAL,
}


def _transient(err: KafkaError) -> bool:
    """True when the broker or the metadata (not the record) is the problem: spool and retry."""
    return err.code() in _TRANSIENT_CODES or err.retriable()


def _purge_without_waiting(producer: Producer, in_flight: bool) -> None:
    """Hand back what librdkafka holds (as _PURGE_* delivery errors, served by poll) without waiting
    for its broker threads to confirm.

    confluent-kafka reads its ``blocking`` flag backwards (Producer.c, 2.x: ``if (blocking)
    purge_strategy |= RD_KAFKA_PURGE_F_NON_BLOCKING``), and its purge holds the GIL while it waits:
    ``blocking=False`` waits for every broker thread, and one that never answers (stuck in
    getaddrinfo in a forked child: glibc's resolver lock, tests/unit/collectors/test_publisher_fork.py)
    froze the whole process. ``blocking=True`` is the call that does not wait; the fork test fails if a
    release turns the flag around.
    """
    producer.purge(in_queue=True, in_flight=in_flight, blocking=True)


@dataclass
class PublisherConfig:
    """Everything the publisher needs; ``from_settings`` maps the ``ENTROLOOP_`` variables."""

    bootstrap: str
    spool_dir: Path
    topic_prefix: str = ""
    client_id: str = "entroloop-publisher"
    queue_size: int = 200_000
    spool_max_bytes: int = 1 << 30
    fsync: FsyncPolicy = "batch"
    compression: str = "lz4"
    linger_ms: int = 20
    delivery_timeout_ms: int = 10_000
    """A record not acknowledged within this time is spooled (librdkafka ``message.timeout.ms``)."""
    probe_interval_s: float = 1.0
    replay_chunk: int = 20_000
    producer_overrides: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> PublisherConfig:
        if not settings.kafka_bootstrap:
            raise ValueError(
                "ENTROLOOP_KAFKA_BOOTSTRAP is empty: the Kafka publisher needs a broker "
                "(the embedded mode publishes through the in-process bus instead)"
            )
        values: dict[str, Any] = {
            "bootstrap": settings.kafka_bootstrap,
            "spool_dir": Path(settings.publisher_spool_dir or settings.data_dir / "spool"),
            "topic_prefix": settings.topic_prefix,
            "client_id": f"entroloop-{settings.node_id}",
            "queue_size": settings.publisher_queue_size,
            "spool_max_bytes": settings.publisher_spool_max_bytes,
            "fsync": settings.publisher_fsync,
            "compression": settings.publisher_compression,
            "linger_ms": settings.publisher_linger_ms,
            "delivery_timeout_ms": settings.publisher_delivery_timeout_ms,
        }
        values.update(overrides)
        return cls(**values)

    def producer_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            "client.id": self.client_id,
            "acks": "all",
            "enable.idempotence": True,
            "compression.type": self.compression,
            "linger.ms": self.linger_ms,
            "batch.size": 1 << 20,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 512 * 1024,
            "message.timeout.ms": self.delivery_timeout_ms,
            "partitioner": "consistent_random",
            # Notice a broker that came back within a second, not after librdkafka's default 10 s.
            "reconnect.backoff.ms": 100,
            "reconnect.backoff.max.ms": 1000,
            "socket.connection.setup.timeout.ms": 5000,
        }
        config.update(self.producer_overrides)
        return config


class Publisher:
    """Non-blocking, spooling, fork-safe Kafka publisher (see the module docstring)."""

    def __init__(self, config: PublisherConfig) -> None:
        self.config = config
        self._counts = collections.Counter[str]()
        self._init_process_state()
        _publishers.add(self)

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> Publisher:
        return cls(PublisherConfig.from_settings(settings, **overrides))

    # --- per-process state (rebuilt in a forked child) -------------------------------------------
    def _init_process_state(self) -> None:
        self._pid = os.getpid()
        self._queue: collections.deque[Event] = collections.deque()
        self._wake = threading.Event()
        self._idle = False
        self._closing = False
        self._closed = False
        self._outage = False
        self._purged = False
        self._replay_spool: Spool | None = None
        self._replay_delivered: set[int] = set()
        self._replay_rejected: set[int] = set()
        self._last_probe = 0.0
        self._lock = threading.Lock()
        # Conditions that fire once per record log at most once per 5 s, with the count so far
        # (entroloop.infra.log_throttle): a refused topic must not bury the log.
        self._drop_log = LogThrottle(5.0)
        self._refusal_log = LogThrottle(5.0)
        self._rejection_log = LogThrottle(5.0)
        make_private_dir(self.config.spool_dir)  # spooled records hold prompts and answers: 0700
        own = self.config.spool_dir / f"{self.config.client_id}-{self._pid}-{next(_instance_numbers)}.spool"
        self._spool = Spool(own, self.config.spool_max_bytes, self.config.fsync)
        self._rejected = RejectedRecords(self.config.spool_dir / "rejected" / f"{own.name}.jsonl")
        # Spool files left by dead processes are replayed first (a live owner's lock keeps us out).
        self._orphans: list[Spool] = []
        for path in orphan_spools(self.config.spool_dir, own):
            try:
                orphan = Spool(path, self.config.spool_max_bytes, self.config.fsync)
            except SpoolLocked:
                continue
            if orphan.has_pending():
                log.info("publisher: adopting %d spooled bytes from %s", orphan.pending_bytes, path)
                self._orphans.append(orphan)
            else:
                orphan.close(remove_if_empty=True)
        # librdkafka's own log lines go to Python logging (served by poll), not to stderr.
        self._producer = Producer({**self.config.producer_config(), "error_cb": self._on_error, "logger": librdkafka_log})
        self._thread = threading.Thread(target=self._run, name="entroloop-publisher", daemon=True)
        self._thread.start()

    def _after_fork_in_child(self) -> None:
        # The parent's producer, thread and spool lock belong to the parent (its handle is kept by
        # _reinit_after_fork): start afresh with an empty queue (the parent still sends what was queued).
        self._counts = collections.Counter[str]()
        self._init_process_state()

    # --- hot path ------------------------------------------------------------------------------
    def publish(self, record: Event) -> bool:
        """Queue ``record`` for Kafka; return at once. False only if it was dropped."""
        queue = self._queue
        if len(queue) < self.config.queue_size and not self._closed:
            queue.append(record)
            if self._idle:
                self._wake.set()
            return True
        if self._closed:
            self._counts["dropped"] += 1
            log.error("publisher: publish() after close(); record %s dropped", record.event_id)
            return False
        # The thread is behind: the record goes to the spool rather than being dropped.
        return self._spool_record(record)

    __call__ = publish

    # --- background thread -----------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            try:
                self._producer.poll(0)
                if self._outage:
                    if not self._purged:
                        # Records librdkafka holds but has not sent yet come back now (as
                        # _PURGE_QUEUE delivery errors, spooled by the callback) instead of after
                        # delivery_timeout_ms: they are older than anything spooled from now on, so
                        # the spool keeps publish order. In-flight ones are left alone (they may
                        # have landed; purging them would re-send them).
                        _purge_without_waiting(self._producer, in_flight=False)
                        self._producer.poll(0)
                        self._purged = True
                    self._spool_queued()
                    if not self._probe():
                        if self._closing:
                            return
                        self._wake.wait(0.05)
                        continue
                if self._orphans or self._spool.has_pending():
                    self._spool_queued()
                    self._replay_chunk()
                    continue
                if self._queue:
                    self._send_queued()
                    continue
                if self._closing:
                    return
                self._idle = True
                self._wake.wait(0.05)
                self._wake.clear()
                self._idle = False
            except Exception:  # noqa: BLE001 - the thread must survive anything and say so
                log.exception("publisher: unexpected error in the background thread")
                time.sleep(0.1)

    def _topic(self, record: Event) -> str:
        return self.config.topic_prefix + record.topic

    def _send_queued(self, limit: int = 10_000) -> None:
        queue, produce, prefix = self._queue, self._producer.produce, self.config.topic_prefix
        on_delivery = self._on_live_delivery
        for _ in range(min(limit, len(queue))):
            if self._outage:
                return
            record = queue.popleft()
            value = codec.encode(record)
            while True:
                try:
                    produce(prefix + record.topic, value, record.request_id.encode(), on_delivery=on_delivery)
                    break
                except BufferError:
                    # librdkafka's own queue is full: wait for deliveries, then try again.
                    self._producer.poll(0.05)
                    if self._outage:
                        self._spool_encoded(prefix + record.topic, record.request_id.encode(), value)
                        return
                except KafkaException as exc:
                    if _transient(exc.args[0]):
                        # produce() itself said "not now" (e.g. a topic its metadata lacks). As in
                        # an outage: the record goes back to the head of the queue, so the outage
                        # path spools it after what librdkafka still holds (publish order).
                        self._counts["delivery_errors"] += 1
                        log.warning("publisher: cannot produce to %s yet (%s); spooling until it can",
                                    prefix + record.topic, exc.args[0].name())
                        queue.appendleft(record)
                        self._outage = True
                        self._last_probe = time.monotonic()
                        return
                    # A verdict on this record alone (e.g. over the client's message.max.bytes).
                    key = record.request_id.encode()
                    if not self._reject(prefix + record.topic, key, value, exc.args[0], by="the Kafka client"):
                        self._spool_encoded(prefix + record.topic, key, value)  # kept there instead
                    break
        self._producer.poll(0)

    def _spool_queued(self) -> None:
        queue = self._queue
        while queue:
            self._spool_record(queue.popleft(), sync=False)
        self._spool.sync()

    def _spool_record(self, record: Event, sync: bool = True) -> bool:
        ok = self._spool_encoded(self._topic(record), record.request_id.encode(), codec.encode(record))
        if sync:
            self._spool.sync()
        return ok

    def _spool_encoded(self, topic: str, key: bytes, value: bytes) -> bool:
        try:
            self._spool.append(topic, key, value)
        except SpoolFull as exc:
            with self._lock:
                self._counts["dropped"] += 1
            if self._drop_log.due():
                log.error("publisher: DROPPING records, %s (dropped so far: %d)", exc, self._counts["dropped"])
            return False
        with self._lock:  # the caller's thread spools too when the queue is full
            self._counts["spooled"] += 1
        return True

    def _probe(self) -> bool:
        """In an outage, ask the broker for metadata now and then; True once it answers."""
        now = time.monotonic()
        if now - self._last_probe < self.config.probe_interval_s:
            return False
        self._last_probe = now
        try:
            self._producer.list_topics(timeout=min(2.0, self.config.probe_interval_s * 2))
        except KafkaException:
            return False
        log.warning("publisher: broker reachable again; replaying the spool")
        self._outage = False
        self._purged = False
        return True

    def _replay_chunk(self) -> None:
        """Send the next spooled frames, wait for their acks, then advance the cursor."""
        spool = self._orphans[0] if self._orphans else self._spool
        messages = spool.read_pending(self.config.replay_chunk)
        if not messages:
            if spool is not self._spool:
                spool.close(remove_if_empty=True)
                self._orphans.pop(0)
            return
        # Records of an interrupted attempt that did reach the broker (or were refused for good and
        # kept) are remembered by their (absolute) end offset and not sent again; the cursor moves
        # past the handled prefix.
        if self._replay_spool is not spool:
            self._replay_spool, self._replay_delivered, self._replay_rejected = spool, set(), set()
        delivered, rejected = self._replay_delivered, self._replay_rejected
        pending = [m for m in messages if m.end not in delivered]
        reports = [0]
        refused: dict[int, KafkaError] = {}

        def on_delivery_of(end: int) -> Any:
            def on_delivery(err: KafkaError | None, _msg: Message) -> None:
                reports[0] += 1
                if err is None:
                    delivered.add(end)
                elif not _transient(err):
                    refused[end] = err

            return on_delivery

        produce = self._producer.produce
        sent: list[SpooledMessage] = []
        for message in pending:
            try:
                while True:
                    try:
                        produce(message.topic, message.value, message.key, on_delivery=on_delivery_of(message.end))
                        sent.append(message)
                        break
                    except BufferError:
                        self._producer.poll(0.05)
            except KafkaException as exc:
                if not _transient(exc.args[0]):  # a verdict on this record alone
                    self._reject_spooled(message, exc.args[0])
                    continue
                # Not sent (e.g. the topic is still unknown): this attempt stops here, the spool
                # keeps the record and the rest; the replay resumes after the next probe.
                log.warning("publisher: replay cannot produce to %s (%s)", message.topic, exc.args[0].name())
                break
        # Wait for every record's report: librdkafka reports each one within delivery_timeout_ms
        # (success or failure). Giving up earlier would replay records that are still on their way.
        deadline = time.monotonic() + 2 * self.config.delivery_timeout_ms / 1000 + 5
        while reports[0] < len(sent) and time.monotonic() < deadline:
            self._producer.poll(0.1)
        # A refusal may be a neighbour's (the broker refuses whole batches): each refused record is
        # sent again alone, and only a refusal of the record alone is final.
        for message in sent:
            if message.end not in refused:
                continue
            err = self._send_alone(message)
            if err is None:
                delivered.add(message.end)
            elif not _transient(err):
                self._reject_spooled(message, err)
            else:
                break
        done = 0
        while done < len(messages) and messages[done].end in delivered:
            done += 1
        if done:
            spool.advance(messages[done - 1].end)
            self._counts["replayed"] += sum(1 for m in messages[:done] if m.end not in rejected)
            for message in messages[:done]:
                delivered.discard(message.end)
                rejected.discard(message.end)
            if not spool.has_pending():  # the file was emptied: offsets start again at 0
                delivered.clear()
                rejected.clear()
        if done < len(messages):
            log.warning("publisher: replay interrupted after %d of %d records; will retry", done, len(messages))
            self._outage = True
            self._last_probe = time.monotonic()

    def _send_alone(self, message: SpooledMessage) -> KafkaError | None:
        """Send one spooled record in a batch of its own and wait for its report: None when
        delivered, else the error."""
        reports: list[KafkaError | None] = []
        # Live records sent before the spool took over may still be in librdkafka: let them go
        # first (their callbacks spool any that fail), so no neighbour's refusal lands on this one.
        self._producer.flush(self.config.delivery_timeout_ms / 1000 + 5)
        try:
            self._producer.produce(message.topic, message.value, message.key,
                                   on_delivery=lambda err, _msg: reports.append(err))
        except KafkaException as exc:
            return exc.args[0]
        self._producer.poll(0)
        deadline = time.monotonic() + self.config.delivery_timeout_ms / 1000 + 5
        while not reports and time.monotonic() < deadline:
            self._producer.poll(0.1)
        return reports[0] if reports else KafkaError(KafkaError._MSG_TIMED_OUT)

    def _reject_spooled(self, message: SpooledMessage, err: KafkaError) -> None:
        """A spooled record refused for good: kept (see ``_reject``), then passed by the cursor."""
        if self._reject(message.topic, message.key, message.value, err):
            self._replay_delivered.add(message.end)
            self._replay_rejected.add(message.end)

    def _reject(self, topic: str, key: bytes, value: bytes, err: KafkaError, by: str = "the broker") -> bool:
        """Keep a record refused for good in ``rejected/`` and send a ``DeadLetter`` naming it.
        False (and the record stays where it is) if it could not be kept. ``by``: whose verdict it
        is (``produce()`` refusing a record over the client's ``message.max.bytes`` is the client's)."""
        reason = f"{by} refused it for good ({err.name()}: {err.str()})"
        try:
            sha256 = self._rejected.keep(topic, key, value, err.name(), reason)
        except OSError as exc:
            log.error("publisher: cannot keep a refused %s record in %s (%s); it stays spooled",
                      topic, self._rejected.path, exc)
            return False
        with self._lock:
            self._counts["failed"] += 1
        if self._rejection_log.due():
            log.error("publisher: %d-byte record for %s refused for good (%s); kept in %s (refused for good so "
                      "far: %d)", len(value), topic, err.name(), self._rejected.path, self._counts["failed"])
        if topic != self.config.topic_prefix + DeadLetter.topic:  # never a dead letter of a dead letter
            self.publish(DeadLetter(
                event_id=derived_event_id(f"{topic}/refused/{sha256}", "dead_letter", at=0.0),
                emitted_at=time.time(),
                node_id=self.config.client_id,
                seq=0,
                request_id=key.decode(errors="replace"),
                source_topic=topic,
                source_partition=0,  # it never reached a partition
                source_offset=0,
                **codec.failure_fields(f"{reason}; kept by the publisher in {self._rejected.path}",
                                       "refused_by_broker", value),
            ))
        return True

    # --- librdkafka callbacks (run on the background thread, inside poll/flush) ------------------
    def _on_live_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is None:
            self._counts["sent"] += 1
            return
        self._counts["delivery_errors"] += 1
        if _transient(err):
            self._outage = True
        else:
            # Maybe a neighbour's refusal (the broker refuses whole batches): the replay sends the
            # record again alone before calling it refused for good.
            if self._refusal_log.due():
                log.warning("publisher: broker refused a record for %s (%s); retrying it alone (refusals so far: "
                            "%d)", msg.topic(), err.name(), self._counts["delivery_errors"])
        self._spool_encoded(msg.topic(), msg.key() or b"", msg.value() or b"")

    def _on_error(self, err: KafkaError) -> None:
        if err.code() in (KafkaError._ALL_BROKERS_DOWN,):
            if not self._outage:
                log.warning("publisher: all brokers down; spooling to %s", self._spool.path)
            self._outage = True
            self._last_probe = time.monotonic()
        elif err.fatal():
            log.error("publisher: fatal producer error: %s", err)
        else:
            log.debug("publisher: producer error: %s", err)

    # --- lifecycle -----------------------------------------------------------------------------
    def flush(self, timeout: float = 30.0) -> bool:
        """Wait until everything queued and spooled is delivered; False if ``timeout`` passed."""
        # The background thread serves the delivery callbacks; this only watches. ``_idle`` is set
        # by the thread when it found no queue, no outage and no spool to replay.
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._idle and not self._queue and len(self._producer) == 0:
                return True
            self._wake.set()
            time.sleep(0.02)
        return False

    def close(self, timeout: float = 30.0) -> dict[str, int]:
        """Deliver what can be delivered within ``timeout``; the rest stays in the spool file (the
        next publisher in this spool folder replays it). Returns the final counters."""
        if self._closed:
            return self.stats()
        delivered = self.flush(timeout)
        self._closing = True
        self._wake.set()
        self._thread.join(timeout=5.0)
        self._closed = True
        if not delivered:
            # Nothing may be lost: whatever librdkafka still holds is purged into the spool.
            self._spool_queued()
            _purge_without_waiting(self._producer, in_flight=True)
            self._producer.poll(0)
            self._producer.flush(1.0)
            self._spool.sync()
            log.warning("publisher: closing with %d bytes left in the spool %s", self._spool.pending_bytes, self._spool.path)
        for orphan in self._orphans:
            orphan.close()
        self._spool.close(remove_if_empty=True)
        return self.stats()

    def stats(self) -> dict[str, int]:
        counts = {k: self._counts[k] for k in ("sent", "spooled", "replayed", "failed", "dropped", "delivery_errors")}
        counts["queued"] = len(self._queue)
        counts["spool_bytes"] = self._spool.pending_bytes + sum(o.pending_bytes for o in self._orphans)
        return counts

    def __enter__(self) -> Publisher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def publisher_from_settings(settings: Settings, **overrides: Any) -> Publisher:
    """The node's publisher, configured from the ``ENTROLOOP_`` settings (used by the vLLM tap)."""
    return Publisher.from_settings(settings, **overrides)


# Every publisher of this process until it is garbage, closed ones too: a closed one's producer may
# wait in a reference cycle (its callbacks are bound methods) for the garbage collector.
_publishers: weakref.WeakSet[Publisher] = weakref.WeakSet()
_instance_numbers = itertools.count()
_abandoned_after_fork: list[Producer] = []


def _reinit_after_fork() -> None:
    for publisher in list(_publishers):
        # Every librdkafka handle of the parent stays referenced in the child, closed publishers'
        # too: destroying one there (the child's garbage collector would) joins threads that do not
        # exist in the child and takes locks they may have held (librdkafka #1674, #2374).
        _abandoned_after_fork.append(publisher._producer)
        if not publisher._closed:
            publisher._after_fork_in_child()


def _close_at_exit() -> None:
    # A process that exits without close() would lose what is still queued in memory: deliver it,
    # or leave it in the spool for the next publisher started in the same spool folder.
    for publisher in list(_publishers):
        if not publisher._closed and publisher._pid == os.getpid():
            publisher.close(timeout=5.0)


os.register_at_fork(after_in_child=_reinit_after_fork)
atexit.register(_close_at_exit)

__all__ = ["Publisher", "PublisherConfig", "publisher_from_settings"]
