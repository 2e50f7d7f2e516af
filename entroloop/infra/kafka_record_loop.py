"""Records from a Kafka topic, at least once: decode, handle, then commit.

For components whose work per record is I/O with effects of their own (webhooks, job claims), not
a batch insert (the sinks have their own batched loop in ``sinks/kafka_sink.py``). Per poll of
``topic`` (consumer group ``group_id``, manual commits, ``kafka_consumer_config``) the loop takes
the first message and whatever else has already been fetched, up to ``max_batch`` (never waiting
for more: a batch adds no latency, it only shares the per-poll costs when records queue up):

1. decode each with ``entroloop.contract.codec``; bytes that are not a record of the ``accepts`` type
   become a ``DeadLetter`` with the reason on the dead-letter topic (delivered before the commit: a
   poison record is kept and skipped, never fatal, never retried forever);
2. ``handle_batch(records)`` (or ``handle(record)`` for each): the caller makes its effects durable
   before returning (an exception stops the loop without a commit: the batch is read again after a
   restart);
3. commit ``offset + 1`` of the batch's last message per partition, synchronously, in one request
   (``entroloop.infra.metrics`` counts records in, dead letters and the last commit per
   ``component``). A commit lost to a rebalance means the next owner reads the records again: the
   handler must be idempotent (the action runner's ``ActionState`` is).

``DeliveringProducer`` is the producer for outputs and dead letters: ``deliver`` returns only once
the broker acknowledged every record (acks=all, idempotent producer), so a caller can commit after it.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from entroloop.contract.codec import CodecError, dead_letter_at, decode, encode
from entroloop.contract.records import DeadLetter, Event
from entroloop.infra.kafka_consumer_config import manual_commit_consumer_config
from entroloop.infra.metrics import DEAD_LETTERS, EVENTS_IN, mark_commit
from entroloop.infra.partition_drain import DrainWatch

log = logging.getLogger(__name__)


class DeliveryFailed(RuntimeError):
    """Records the broker did not acknowledge in time: nothing may be committed past them."""


class DeliveringProducer:
    """A confluent-kafka producer whose ``deliver`` waits for the broker's acknowledgement of each record."""

    def __init__(self, bootstrap: str, client_id: str, logger_name: str, **overrides: Any) -> None:
        from confluent_kafka import Producer

        self._producer = Producer({
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            "linger.ms": 5,
            "client.id": client_id,
            "logger": logging.getLogger(logger_name),
            **overrides,
        })
        self.delivered = 0

    def deliver(self, messages: Sequence[tuple[str, str, bytes]], timeout_s: float = 30.0) -> list[int]:
        """Send (topic, key, value) messages and wait; the indexes acknowledged (all, or raises
        ``DeliveryFailed`` naming how many were not)."""
        acked: list[int] = []
        errors: list[str] = []

        def on_delivery(index: int) -> Callable[[Any, Any], None]:
            def done(err: Any, _message: Any) -> None:
                (errors.append(str(err)) if err is not None else acked.append(index))
            return done

        for index, (topic, key, value) in enumerate(messages):
            while True:
                try:
                    self._producer.produce(topic, value=value, key=key.encode(), on_delivery=on_delivery(index))
                    break
                except BufferError:  # the local queue is full: let deliveries drain it
                    self._producer.poll(0.1)
        deadline = time.monotonic() + timeout_s
        while len(acked) + len(errors) < len(messages) and time.monotonic() < deadline:
            self._producer.flush(min(1.0, max(0.0, deadline - time.monotonic())))
        self.delivered += len(acked)
        if len(acked) < len(messages):
            reason = errors[0] if errors else f"no acknowledgement within {timeout_s:g}s"
            raise DeliveryFailed(f"{len(messages) - len(acked)} of {len(messages)} records not delivered: {reason}")
        return sorted(acked)

    def close(self, timeout_s: float = 10.0) -> int:
        """Flush what is left; the number of records still undelivered."""
        return self._producer.flush(timeout_s)


@dataclass
class LoopStats:
    messages: int = 0
    handled: int = 0
    dead_letters: int = 0
    commits: int = 0
    committed: int = 0
    commit_failures: int = 0
    batches: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class RecordConsumer:
    """Consume ``topic`` one record at a time into ``handle`` (see the module docstring)."""

    def __init__(self, settings: Any, *, topic: str, accepts: type[Event], group_id: str, client_id: str,
                 producer: DeliveringProducer, component: str, handle: Callable[[Event], None] | None = None,
                 handle_batch: Callable[[list[Event]], None] | None = None, max_batch: int = 500,
                 session_timeout_s: float = 30.0, consumer_config: dict[str, Any] | None = None) -> None:
        from confluent_kafka import Consumer

        self.settings = settings
        self.topic = topic  # the logical name (no prefix): what dead letters cite
        self.kafka_topic = settings.topic_prefix + topic
        self.dead_letter_topic = settings.topic_prefix + DeadLetter.topic
        self.accepts = accepts
        if (handle is None) == (handle_batch is None):
            raise ValueError("give exactly one of handle (per record) and handle_batch")
        self.handle = handle
        self.handle_batch = handle_batch
        self.max_batch = max(1, max_batch)
        self.producer = producer
        self.component = component
        self.group_id = group_id
        self.stats = LoopStats()
        config = manual_commit_consumer_config(
            settings, group_id=group_id, client_id=client_id, logger_name=f"{__name__}.librdkafka.{component}",
            session_timeout_s=session_timeout_s,
        )
        config.update(consumer_config or {})
        self.consumer = Consumer(config)
        self._drain = DrainWatch()
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    def run(self, until_idle: bool = False, poll_s: float = 0.5, max_wait_s: float | None = None) -> LoopStats:
        """Consume until ``stop()``; with ``until_idle``, return once every assigned partition is at its
        end (``max_wait_s``: give up waiting for an assignment after that long)."""
        started = time.monotonic()
        self.consumer.subscribe([self.kafka_topic], on_assign=self._drain.on_assign,
                                on_revoke=self._drain.on_revoke, on_lost=self._drain.on_revoke)
        try:
            while not self._stop.is_set():
                message = self.consumer.poll(poll_s)
                if message is not None:
                    more = self.consumer.consume(self.max_batch - 1, 0) if self.max_batch > 1 else []
                    self._take([message, *more])
                elif until_idle and (self._drain.drained or (max_wait_s is not None and not self._drain.assigned
                                                         and time.monotonic() - started > max_wait_s)):
                    break
        finally:
            self.consumer.close()
        return self.stats

    def _take(self, messages: list[Any]) -> None:
        from confluent_kafka import KafkaError

        records: list[Event] = []
        dead: list[tuple[str, str, bytes]] = []
        last: dict[tuple[str, int], int] = {}  # (topic, partition) -> the batch's last offset there
        for message in messages:
            error = message.error()
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    self._drain.reached_end(message.partition())
                else:
                    log.warning("%s consumer: %s", self.component, error)
                continue
            self._drain.got_record(message.partition())
            last[(message.topic(), message.partition())] = message.offset()
            self.stats.messages += 1
            EVENTS_IN.labels(self.component, self.topic).inc()
            value = message.value() or b""
            try:
                record = decode(value, self.settings.max_record_bytes)
                if not isinstance(record, self.accepts):
                    err = CodecError(f"a {type(record).__name__} record on topic {self.topic}")
                    err.error_type = "wrong_topic"
                    raise err
            except CodecError as err:
                letter = self._dead_letter(message, value, err)
                dead.append((self.dead_letter_topic, letter.request_id, encode(letter)))
                log.warning("%s consumer: offset %d of %s dead-lettered: %s", self.component, message.offset(),
                            self.kafka_topic, err.reason)
            else:
                records.append(record)
        if dead:
            self.producer.deliver(dead)
            self.stats.dead_letters += len(dead)
            DEAD_LETTERS.labels(self.component, self.topic).inc(len(dead))
        if records:
            if self.handle_batch is not None:
                self.handle_batch(records)
            else:
                for record in records:
                    self.handle(record)  # type: ignore[misc]
            self.stats.handled += len(records)
        if last:
            self.stats.batches += 1
            self._commit(last, len(records) + len(dead))

    def _commit(self, last: dict[tuple[str, int], int], count: int) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        try:
            self.consumer.commit(offsets=[TopicPartition(topic, partition, offset + 1)
                                          for (topic, partition), offset in last.items()], asynchronous=False)
            self.stats.commits += 1
            self.stats.committed += count
            mark_commit(self.component)
        except KafkaException as exc:  # a rebalance: the next owner re-reads them; the handler is idempotent
            self.stats.commit_failures += 1
            log.warning("%s consumer: commit of %d record(s) failed: %s", self.component, count, exc)

    def _dead_letter(self, message: Any, value: bytes, err: CodecError) -> DeadLetter:
        """Same id derivation as the sinks' and the trainer's: a redelivery repeats the id."""
        return dead_letter_at(self.topic, message.partition(), message.offset(), key=message.key(),
                              payload=value, error=err, node_id=f"{self.component}@{self.settings.node_id}")


__all__ = ["DeliveringProducer", "DeliveryFailed", "LoopStats", "RecordConsumer"]
