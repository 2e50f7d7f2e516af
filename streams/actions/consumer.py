"""``entroloop actions``: the action runner as its own Kafka consumer of the alerts topic.

Its own process (consumer group ``<prefix>entroloop-actions``), not an agent of the stream worker:
runbook steps wait on webhooks with retries and backoff, and a slow gateway must never hold up the
analytics. Per batch of alerts (what one poll has fetched, ``entroloop.infra.kafka_record_loop``),
at least once:

1. ``ActionRunner.process_batch``: each matching runbook runs once per alert key (``ActionState``);
   its Action and RetrainRequest records are queued in the state's outbox in the same transaction
   that marks the execution finished;
2. the outbox is delivered to the actions and retrain topics and acknowledged by the broker, then
   cleared;
3. only then are the batch's offsets committed.

A crash before 3 re-reads the batch: its finished executions are duplicates (no second webhook),
one that was running is run again with the same ``Idempotency-Key`` (the receiver answers it from
memory) and the outbox, delivered again at start, brings any records the crash kept from Kafka (same
ids: the sinks absorb a repeat). Alerts that cannot be decoded go to the dead-letter topic with the
reason. Batching matters because each step of 1-3 is a durable write or a broker round trip: one
alert at a time, the runner kept up with ~145 alerts/s; a batch shares those costs.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

from entroloop.streams.actions.runner import ActionRunner

from entroloop.contract.codec import decode
from entroloop.contract.records import Action, Alert, Event
from entroloop.contract.topics import topic_of
from entroloop.infra.kafka_record_loop import (
    DeliveringProducer,
    DeliveryFailed,
    RecordConsumer,
)
from entroloop.infra.metrics import ACTIONS, EVENTS_OUT

log = logging.getLogger(__name__)

DELIVERY_ATTEMPTS = 5


class ActionConsumer:
    """Alerts from Kafka through ``runner`` (built with ``outbox=True``), outputs to Kafka."""

    def __init__(self, settings: Any, runner: ActionRunner, *, session_timeout_s: float = 30.0, max_batch: int = 500,
                 consumer_config: dict[str, Any] | None = None, sleep: Any = time.sleep) -> None:
        if not runner.outbox:
            raise ValueError("the action consumer needs an ActionRunner built with outbox=True")
        self.settings = settings
        self.runner = runner
        self.prefix = settings.topic_prefix
        self.producer = DeliveringProducer(settings.kafka_bootstrap, f"entroloop-actions-{settings.node_id}",
                                           "entroloop.streams.actions.librdkafka")
        self.loop = RecordConsumer(
            settings, topic=Alert.topic, accepts=Alert, handle_batch=self._handle, max_batch=max_batch,
            group_id=f"{settings.topic_prefix}entroloop-actions", client_id=f"entroloop-actions-{settings.node_id}",
            producer=self.producer, component="actions", session_timeout_s=session_timeout_s,
            consumer_config=consumer_config,
        )
        self.published: Counter[str] = Counter()
        self._sleep = sleep

    def stop(self) -> None:
        self.loop.stop()

    def run(self, until_idle: bool = False, max_wait_s: float | None = None) -> dict[str, Any]:
        """Deliver what a previous run left in the outbox, then consume until stopped (or idle)."""
        resent = self.deliver_outbox()
        if resent:
            log.warning("actions: re-delivered %d record(s) a previous run had not delivered", resent)
        try:
            stats = self.loop.run(until_idle=until_idle, max_wait_s=max_wait_s)
        finally:
            undelivered = self.producer.close()
        return {**stats.as_dict(), "resent_at_start": resent, "published": dict(self.published),
                "outcomes": dict(self.runner.counters), "undelivered": undelivered}

    def _handle(self, records: list[Event]) -> None:
        self.runner.process_batch(records)
        self.deliver_outbox()

    def deliver_outbox(self) -> int:
        """Send every queued record and clear it once acknowledged; retries with backoff, then raises
        ``DeliveryFailed`` (the alert is not committed; a restart resumes from the outbox)."""
        entries = self.runner.state.outbox()
        if not entries:
            return 0
        messages, records = [], []
        for _, value in entries:
            record = decode(value, self.settings.max_record_bytes)
            records.append(record)
            messages.append((self.prefix + topic_of(record).name, record.request_id, value))
        for attempt in range(1, DELIVERY_ATTEMPTS + 1):
            try:
                self.producer.deliver(messages)
                break
            except DeliveryFailed as exc:
                if attempt == DELIVERY_ATTEMPTS:
                    raise
                log.warning("actions: %s; retrying (%d/%d)", exc, attempt, DELIVERY_ATTEMPTS)
                self._sleep(min(2.0 ** attempt, 30.0))
        self.runner.state.delivered([entry_id for entry_id, _ in entries])
        for record in records:
            topic = topic_of(record).name
            self.published[topic] += 1
            EVENTS_OUT.labels("actions", topic).inc()
            if isinstance(record, Action):
                ACTIONS.labels(record.runbook, record.outcome).inc()
        return len(messages)


__all__ = ["ActionConsumer"]
