"""The publisher against the real broker: delivery, and an outage of the broker with replay."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from entroloop.collectors.publisher import Publisher, PublisherConfig
from entroloop.collectors.rejected import read_rejected
from entroloop.collectors.spool import Spool

from entroloop.contract import codec
from entroloop.contract.ids import NodeStamper, new_trace_id
from entroloop.contract.records import DeadLetter, Event, Feedback, Span
from entroloop.contract.topics import TOPIC_BY_TYPE
from entroloop.infra.kafka_topics import create_missing_topics, ensure_topics
from tests.integration.conftest import REPO_ROOT

pytestmark = pytest.mark.kafka


def make_records(n: int, stamper: NodeStamper) -> list[Event]:
    """Alternate spans and feedback, keyed by a request id per pair."""
    out: list[Event] = []
    for i in range(n):
        common = {**stamper.stamp(), "request_id": f"req-{i // 2}", "trace_id": new_trace_id()}
        if i % 2:
            out.append(Feedback(**common, rating=-1, comment="wrong amount"))
        else:
            out.append(Span(**common, span_id=f"{i:016x}", name="request", start_time=0.0, end_time=1.0))
    return out


def consume_all(bootstrap: str, topics: list[str], expected: int, timeout: float = 60.0) -> list[Event]:
    """Read ``topics`` from the beginning until ``expected`` records arrived or ``timeout`` passed,
    then read on for another second to catch duplicates."""
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": f"check-{time.time_ns()}", "auto.offset.reset": "earliest",
         "enable.auto.commit": False}
    )
    consumer.subscribe(topics)
    records: list[Event] = []
    deadline = time.monotonic() + timeout
    extra_until = None
    try:
        while time.monotonic() < deadline:
            for message in consumer.consume(10_000, timeout=0.5):
                if message.error() is None:
                    records.append(codec.decode(message.value()))
            if len(records) >= expected and extra_until is None:
                extra_until = time.monotonic() + 1.0
            if extra_until is not None and time.monotonic() > extra_until:
                break
    finally:
        consumer.close()
    return records


def publish_all(publisher: Publisher, records: list[Event]) -> dict[str, int]:
    """Publish ``records``, wait until all are delivered (or fail the test), close; the counters."""
    try:
        for record in records:
            assert publisher.publish(record)
        assert publisher.flush(60), publisher.stats()
    finally:
        stats = publisher.close(timeout=5)
    return stats


def report(label: str, sent: list[Event], stored: list[Event]) -> dict[str, int]:
    sent_ids = {r.event_id for r in sent}
    stored_ids = [r.event_id for r in stored]
    unique = set(stored_ids)
    figures = {
        "sent": len(sent),
        "stored": len(stored_ids),
        "duplicates": len(stored_ids) - len(unique),
        "lost": len(sent_ids - unique),
    }
    print(f"\n{label}: " + " ".join(f"{k}={v}" for k, v in figures.items()))
    return figures


def test_publish_n_and_consume_n_back(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    ensure_topics(kafka_bootstrap, topic_prefix, topics=[TOPIC_BY_TYPE[Span], TOPIC_BY_TYPE[Feedback]])
    records = make_records(20_000, NodeStamper("node-it"))
    publisher = Publisher(PublisherConfig(kafka_bootstrap, tmp_path / "spool", topic_prefix=topic_prefix))
    for record in records:
        assert publisher.publish(record)
    assert publisher.flush(60), publisher.stats()
    stats = publisher.close()
    assert stats["sent"] == len(records) and stats["spooled"] == 0 and stats["dropped"] == 0, stats

    stored = consume_all(kafka_bootstrap, [topic_prefix + Span.topic, topic_prefix + Feedback.topic], len(records))
    figures = report("publish/consume", records, stored)
    assert figures["lost"] == 0 and figures["duplicates"] == 0
    # Keyed by request_id: both records of one request share a partition number.
    consumer = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": "unused"})
    try:
        meta = consumer.list_topics(topic_prefix + Span.topic, timeout=10)
        assert len(meta.topics[topic_prefix + Span.topic].partitions) == 6
    finally:
        consumer.close()


def test_a_topic_that_does_not_exist_yet_is_waited_for_not_dropped(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    """librdkafka fails records for a topic its metadata lacks (``_UNKNOWN_TOPIC``): right after
    CreateTopics the topic may not have reached the broker that answered (librdkafka #2858, #4904),
    or the operator has not created it yet. That is the metadata's problem, not the record's: the
    publisher spools the records and delivers them once the topic is there (it used to count them
    ``failed`` and drop them). The broker would create the topic itself on first use, so the
    publisher is told not to ask, and to give up on unknown topics after 0.2 s instead of 30 s."""
    config = PublisherConfig(
        kafka_bootstrap, tmp_path / "spool", topic_prefix=topic_prefix,
        producer_overrides={"allow.auto.create.topics": False, "topic.metadata.propagation.max.ms": 200},
    )
    publisher = Publisher(config)
    records = make_records(40, NodeStamper("node-early"))
    try:
        for record in records:
            assert publisher.publish(record)
        deadline = time.monotonic() + 30
        while publisher.stats()["spooled"] < len(records) and time.monotonic() < deadline:
            time.sleep(0.1)
        waiting = publisher.stats()
        assert waiting["spooled"] == len(records) and waiting["failed"] == 0 and waiting["sent"] == 0, waiting
        ensure_topics(kafka_bootstrap, topic_prefix, topics=[TOPIC_BY_TYPE[Span], TOPIC_BY_TYPE[Feedback]])
        assert publisher.flush(60), publisher.stats()
    finally:
        stats = publisher.close(timeout=5)
    assert stats["replayed"] == len(records) and stats["failed"] == stats["dropped"] == 0, stats
    stored = consume_all(kafka_bootstrap, [topic_prefix + Span.topic, topic_prefix + Feedback.topic], len(records))
    figures = report("topic created after publishing", records, stored)
    assert figures["lost"] == 0


class _ForgetsTopic:
    """The publisher's real producer, except that its metadata "forgets" one topic for the first
    ``times`` produce() calls to it: produce() raises ``_UNKNOWN_TOPIC`` as librdkafka does when its
    cache marked a just-created topic non-existent (librdkafka #4904) while other topics flow."""

    def __init__(self, producer: Any, topic: str, times: int) -> None:
        self._producer, self._topic, self.left = producer, topic, times

    def produce(self, topic: str, *args: Any, **kwargs: Any) -> None:
        if topic == self._topic and self.left > 0:
            self.left -= 1
            raise KafkaException(KafkaError(KafkaError._UNKNOWN_TOPIC, "Unable to produce message: Local: Unknown topic"))
        self._producer.produce(topic, *args, **kwargs)

    def __len__(self) -> int:
        return len(self._producer)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)


def test_a_topic_the_client_metadata_forgot_is_retried_not_dropped(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    """produce() raising "unknown topic" for records of one topic while the others flow (a CI run
    of the Kafka demo lost 4 of 600 audit records this way, right after the topics were created):
    the records are spooled and replayed once produce() takes them again; none is counted failed."""
    ensure_topics(kafka_bootstrap, topic_prefix, topics=[TOPIC_BY_TYPE[Span], TOPIC_BY_TYPE[Feedback]])
    publisher = Publisher(PublisherConfig(kafka_bootstrap, tmp_path / "spool", topic_prefix=topic_prefix))
    publisher._producer = _ForgetsTopic(publisher._producer, topic_prefix + Feedback.topic, times=3)
    records = make_records(400, NodeStamper("node-forgot"))
    stats = publish_all(publisher, records)
    assert stats["failed"] == stats["dropped"] == 0 and stats["delivery_errors"] >= 1, stats
    assert stats["sent"] + stats["replayed"] == len(records), stats
    stored = consume_all(kafka_bootstrap, [topic_prefix + Span.topic, topic_prefix + Feedback.topic], len(records))
    assert report("topic forgotten by the client's metadata", records, stored)["lost"] == 0


def _big_feedback(stamper: NodeStamper) -> Feedback:
    """A feedback record of ~40 KB that lz4 cannot shrink below the 4 KB limit set below."""
    return Feedback(**stamper.stamp(), request_id="req-big", trace_id=new_trace_id(), rating=-1,
                    comment=os.urandom(20_000).hex())


def _create_small_feedback_topic(bootstrap: str, prefix: str, broker_limit: bool = True) -> None:
    """The feedback topic with one partition (so librdkafka batches the big record with its
    neighbours) and, with ``broker_limit``, a limit of 4 KB per batch (which ordinary batches of
    small records pass too); spans and dead letters as usual."""
    config = {"max.message.bytes": "4096"} if broker_limit else {}
    create_missing_topics(bootstrap, {prefix + Feedback.topic: (1, config)})
    ensure_topics(bootstrap, prefix, topics=[TOPIC_BY_TYPE[Span], TOPIC_BY_TYPE[DeadLetter]])


def _check_refused_for_good(bootstrap: str, prefix: str, spool_dir: Path, big: Feedback,
                            stats: dict[str, int]) -> DeadLetter:
    """The big record is kept (0600, with the reason) and named by a dead letter (returned); nothing
    else failed."""
    assert stats["failed"] == 1 and stats["dropped"] == 0 and stats["spool_bytes"] == 0, stats
    kept_files = list((spool_dir / "rejected").glob("*.jsonl"))
    assert len(kept_files) == 1, kept_files
    assert kept_files[0].stat().st_mode & 0o777 == 0o600
    kept = read_rejected(kept_files[0])
    assert [codec.decode(k["value"]).event_id for k in kept] == [big.event_id]
    assert kept[0]["error"] == "MSG_SIZE_TOO_LARGE" and kept[0]["topic"] == prefix + Feedback.topic
    letters = consume_all(bootstrap, [prefix + DeadLetter.topic], 1, timeout=30)
    assert len({letter.event_id for letter in letters}) == 1, letters
    letter = letters[0]
    assert isinstance(letter, DeadLetter) and letter.error_type == "refused_by_broker"
    assert letter.payload_sha256 == kept[0]["sha256"] and letter.payload_size == kept[0]["size"]
    assert letter.source_topic == prefix + Feedback.topic and "MSG_SIZE_TOO_LARGE" in letter.reason
    return letter


@pytest.mark.parametrize("limit", ["broker", "client"])
def test_a_record_refused_for_good_is_kept_and_its_batch_is_delivered(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, limit: str
) -> None:
    """The broker refuses whole batches: one record over the topic's max.message.bytes failed every
    record librdkafka had batched with it, and the publisher dropped them all as ``failed`` (found
    on the real broker). Now a refused record is retried alone and only its own refusal is final:
    the neighbours are delivered, the big one is kept in ``rejected/`` with a dead letter naming it.
    ``client``: produce() itself refuses it (over the producer's message.max.bytes)."""
    _create_small_feedback_topic(kafka_bootstrap, topic_prefix, broker_limit=limit == "broker")
    stamper = NodeStamper("node-big")
    small = make_records(200, stamper)
    big = _big_feedback(stamper)
    records = small[:100] + [big] + small[100:]
    overrides = {"message.max.bytes": 30_000} if limit == "client" else {}
    spool_dir = tmp_path / "spool"
    publisher = Publisher(PublisherConfig(kafka_bootstrap, spool_dir, topic_prefix=topic_prefix,
                                          producer_overrides=overrides))
    stats = publish_all(publisher, records)
    assert stats["sent"] + stats["replayed"] == len(small) + 1, stats  # + the dead letter
    stored = consume_all(kafka_bootstrap, [topic_prefix + Span.topic, topic_prefix + Feedback.topic], len(small))
    assert report(f"one record refused ({limit})", small, stored)["lost"] == 0
    letter = _check_refused_for_good(kafka_bootstrap, topic_prefix, spool_dir, big, stats)
    assert letter.reason.startswith({"broker": "the broker", "client": "the Kafka client"}[limit]), letter.reason


def test_a_spooled_record_refused_for_good_does_not_block_the_replay(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    """A spool left by a dead process holds a record the broker will never take, between others.
    The replay used to offer it again after every probe, for ever, and nothing behind it was
    delivered; now it is kept in ``rejected/`` and the replay moves on."""
    _create_small_feedback_topic(kafka_bootstrap, topic_prefix)
    stamper = NodeStamper("node-dead")
    small = make_records(60, stamper)
    big = _big_feedback(stamper)
    spool_dir = tmp_path / "spool"
    left = Spool(spool_dir / "entroloop-dead-1-0.spool", 1 << 30)
    for record in small[:30] + [big] + small[30:]:
        left.append(topic_prefix + record.topic, record.request_id.encode(), codec.encode(record))
    left.close()
    publisher = Publisher(PublisherConfig(kafka_bootstrap, spool_dir, topic_prefix=topic_prefix))
    try:
        assert publisher.flush(60), publisher.stats()
    finally:
        stats = publisher.close(timeout=5)
    assert stats["replayed"] == len(small) + 1, stats  # + the dead letter, spooled behind them
    stored = consume_all(kafka_bootstrap, [topic_prefix + Span.topic, topic_prefix + Feedback.topic], len(small))
    assert report("spooled record refused for good", small, stored)["lost"] == 0
    _check_refused_for_good(kafka_bootstrap, topic_prefix, spool_dir, big, stats)


def services(*args: str) -> None:
    subprocess.run(["bash", str(REPO_ROOT / "scripts/services.sh"), *args], check=True, timeout=180)


@pytest.mark.reliability
def test_broker_down_10s_while_publishing_spools_then_replays(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    """Stops the shared broker for 10 s (scripts/services.sh down/up kafka) while publishing."""
    ensure_topics(kafka_bootstrap, topic_prefix, topics=[TOPIC_BY_TYPE[Span], TOPIC_BY_TYPE[Feedback]])
    stamper = NodeStamper("node-outage")
    config = PublisherConfig(
        kafka_bootstrap, tmp_path / "spool", topic_prefix=topic_prefix, delivery_timeout_ms=5000, fsync="batch"
    )
    publisher = Publisher(config)
    sent: list[Event] = []
    stop = threading.Event()
    max_publish_s = 0.0

    def publish_steadily() -> None:  # ~1000 records/s, as a serving node would
        nonlocal max_publish_s
        while not stop.is_set():
            for record in make_records(10, stamper):
                started = time.perf_counter()
                publisher.publish(record)
                max_publish_s = max(max_publish_s, time.perf_counter() - started)
                sent.append(record)
            time.sleep(0.01)

    thread = threading.Thread(target=publish_steadily)
    thread.start()
    try:
        time.sleep(3)
        services("down", "kafka")
        time.sleep(10)
        spooled_during_outage = publisher.stats()["spooled"]
        services("up", "kafka")
        time.sleep(5)
    finally:
        stop.set()
        thread.join()
        if not Path(REPO_ROOT / ".services/kafka/kafka.pid").exists():
            services("up", "kafka")
    assert publisher.flush(120), publisher.stats()
    stats = publisher.close()
    print(f"\npublisher counters: {stats}; spooled during the outage: {spooled_during_outage}; "
          f"slowest publish() call: {max_publish_s * 1e6:.0f} µs")
    assert spooled_during_outage > 0, "the outage must have gone to the spool"
    assert stats["replayed"] >= stats["spooled"] - stats["dropped"] > 0
    assert stats["dropped"] == 0 and stats["spool_bytes"] == 0

    stored = consume_all(kafka_bootstrap, [topic_prefix + Span.topic, topic_prefix + Feedback.topic], len(sent), 120)
    figures = report("broker outage", sent, stored)
    assert figures["lost"] == 0
    # Only records in flight when the broker vanished can land twice (delivered, but the ack was
    # lost, so they were spooled too); a replay never re-sends what it saw delivered.
    assert figures["duplicates"] <= stats["delivery_errors"]
