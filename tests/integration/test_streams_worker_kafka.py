"""The Faust worker against the real broker: processing, dead letters, health, and the issue-606 guard.

Each worker runs as its own process (tests/integration/streams_worker_main.py) so it can be killed
with SIGKILL, as a crash would.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import msgspec
import pytest
from confluent_kafka import Consumer

from entroloop.contract import codec
from entroloop.contract.ids import NodeStamper
from entroloop.contract.records import Alert, DeadLetter, Event, Feedback, Health
from entroloop.contract.topics import TOPIC_BY_TYPE
from entroloop.infra.kafka_topics import ensure_topics
from tests.integration.worker_process import WorkerProcess
from tests.integration.acknowledged_producer import AcknowledgedProducer

pytestmark = pytest.mark.kafka

TOPICS = [TOPIC_BY_TYPE[t] for t in (Feedback, Alert, DeadLetter, Health)]


def Worker(tmp: Path, *args: str) -> WorkerProcess:  # noqa: N802 - reads as the class it returns
    """One ``streams_worker_main`` process (see its docstring for ``args``)."""
    return WorkerProcess(tmp, "tests.integration.streams_worker_main", *args,
                         env={"ENTROLOOP_FAUST_DATADIR": str(tmp / "faust")})


class TopicReader:
    """Reads a topic from the beginning, accumulating decoded records across calls."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"reader-{time.time_ns()}",
                                  "auto.offset.reset": "earliest", "enable.auto.commit": False})
        self.consumer.subscribe([topic])
        self.records: list[Event] = []

    def read_until(self, predicate, timeout: float) -> bool:  # type: ignore[no-untyped-def]
        deadline = time.monotonic() + timeout
        while True:
            for message in self.consumer.consume(1000, timeout=0.3):
                if message.error() is None:
                    self.records.append(codec.decode(message.value()))
            if predicate(self.records):
                return True
            if time.monotonic() > deadline:
                return False

    def close(self) -> None:
        self.consumer.close()


def produce(bootstrap: str, topic: str, items: list[tuple[bytes, bytes]]) -> None:
    producer = AcknowledgedProducer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    for key, value in items:
        producer.produce(topic, value, key)
    assert producer.flush(30) == 0


def feedback(n: int, slow_first: bool) -> list[Feedback]:
    stamper = NodeStamper("node-streams")
    return [
        Feedback(**stamper.stamp(), request_id="slow" if (slow_first and i == 0) else f"req-{i}", rating=-1)
        for i in range(n)
    ]


def seen_alerts(records: list[Event]) -> set[str]:
    return {r.alert_key.removeprefix("seen:") for r in records if isinstance(r, Alert)}


def run_crash_scenario(bootstrap: str, prefix: str, tmp: Path, concurrency: int,
                       stop_signal: int = signal.SIGKILL, slow_seconds: float = 60) -> dict[str, int]:
    """Event 0 is slow; events 1..9 are fast. Stop the worker with ``stop_signal`` while event 0 is
    in flight (after the fast ones were processed and a commit had time to happen), restart it,
    and count what was lost."""
    ensure_topics(bootstrap, prefix, partitions=1, topics=TOPICS)
    records = feedback(10, slow_first=True)
    produce(bootstrap, prefix + Feedback.topic, [(r.request_id.encode(), codec.encode(r)) for r in records])
    alerts = TopicReader(bootstrap, prefix + Alert.topic)
    try:
        first = Worker(tmp, bootstrap, prefix, "slow", str(slow_seconds), str(concurrency))
        fast_ids = {r.event_id for r in records[1:]}
        if concurrency > 1:
            ok = alerts.read_until(lambda rs: fast_ids <= seen_alerts(rs), timeout=90)
            assert ok, f"fast events were not processed; worker log:\n{first.log_tail()}"
        else:
            # One actor: the slow event holds the partition, later events wait behind it.
            assert "Worker ready" in _wait_for_log(first, "Worker ready", 90), first.log_tail()
            time.sleep(3)
            assert not (fast_ids & seen_alerts(alerts.records)), "nothing passes the in-flight event"
        time.sleep(2.0)  # several commit intervals (0.3 s): whatever Faust would commit, it has
        first.kill(stop_signal)

        second = Worker(tmp, bootstrap, prefix, "slow", "0", str(concurrency))
        # A marker produced after the restart proves the second worker owns the partition and has
        # read past the committed offset: an event still missing then is lost, not late.
        [marker] = feedback(1, slow_first=False)
        produce(bootstrap, prefix + Feedback.topic, [(b"marker", codec.encode(marker))])
        ok = alerts.read_until(lambda rs: marker.event_id in seen_alerts(rs), timeout=90)
        assert ok, f"the restarted worker did not process the marker; log:\n{second.log_tail()}"
        all_ids = {r.event_id for r in records}
        alerts.read_until(lambda rs: all_ids <= seen_alerts(rs), timeout=3)
        second.kill()
    finally:
        alerts.close()
    seen = seen_alerts(alerts.records)
    figures = {"sent": len(records), "processed": len(seen & all_ids), "lost": len(all_ids - seen),
               "slow_event_lost": int(records[0].event_id not in seen)}
    print(f"\nconcurrency={concurrency}: " + " ".join(f"{k}={v}" for k, v in figures.items()))
    return figures


def _wait_for_log(worker: Worker, text: str, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = worker.log_path.read_text(errors="replace")
        if text in log:
            return log
        if worker.proc.poll() is not None:
            break
        time.sleep(0.2)
    return worker.log_path.read_text(errors="replace")


def test_guarded_worker_loses_nothing_when_killed_with_an_event_in_flight(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    figures = run_crash_scenario(kafka_bootstrap, topic_prefix, tmp_path, concurrency=1)
    assert figures["lost"] == 0 and figures["slow_event_lost"] == 0


def test_worker_stopped_with_an_event_in_flight_commits_nothing_past_it(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    """SIGTERM (a deploy, a scale-down) while an event is being processed: the worker must finish
    it (Faust's ``wait_empty`` on stop) or leave its offset uncommitted. Were the agent cancelled
    first, ``take_events`` would acknowledge the unfinished batch in its ``finally`` and the last
    commit on stop would carry it past, so the next owner of the partition would skip it."""
    figures = run_crash_scenario(kafka_bootstrap, topic_prefix, tmp_path, concurrency=1,
                                 stop_signal=signal.SIGTERM, slow_seconds=8)
    assert figures["lost"] == 0 and figures["slow_event_lost"] == 0


def test_with_two_actors_the_strict_commit_still_loses_nothing(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    """The same scenario with concurrency 2: Faust alone commits past the slow event still in
    flight and the crash loses it (faust-streaming issue 606; shown on Faust's own commit code in
    tests/unit/streams/test_faust_offsets.py). The strict commit (entroloop.streams.faust_offsets) holds the
    offset at the unfinished head, so the restarted worker processes it."""
    figures = run_crash_scenario(kafka_bootstrap, topic_prefix, tmp_path, concurrency=2)
    assert figures["lost"] == 0 and figures["slow_event_lost"] == 0


def test_poison_records_become_dead_letters_and_health_is_published(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    ensure_topics(kafka_bootstrap, topic_prefix, partitions=1, topics=TOPICS)
    good = feedback(3, slow_first=False)
    good[2] = msgspec.structs.replace(good[2], emitted_at=time.time() + 3600)  # from a node whose clock is an hour fast
    items = [(r.request_id.encode(), codec.encode(r)) for r in good]
    items.insert(1, (b"req-poison", b"\x93not a record"))
    produce(kafka_bootstrap, topic_prefix + Feedback.topic, items)
    dead = TopicReader(kafka_bootstrap, topic_prefix + DeadLetter.topic)
    health = TopicReader(kafka_bootstrap, topic_prefix + Health.topic)
    alerts = TopicReader(kafka_bootstrap, topic_prefix + Alert.topic)
    worker = Worker(tmp_path, kafka_bootstrap, topic_prefix, "none", "0", "1")
    try:
        assert alerts.read_until(lambda rs: len(seen_alerts(rs)) == 3, 60), worker.log_tail()
        assert dead.read_until(lambda rs: len(rs) >= 1, 30), worker.log_tail()
        wanted = {"consumer_lag", "last_commit_age_s", "recovery_refetches"}
        assert health.read_until(lambda rs: wanted <= {r.metric for r in rs}, 30), worker.log_tail()
        assert health.read_until(lambda rs: any(r.metric == "events_ahead_of_clock" and r.value == 1.0 for r in rs), 30), \
            worker.log_tail()  # counted, and still processed (3 alerts above)
    finally:
        worker.kill()
        for reader in (dead, health, alerts):
            reader.close()
    [letter] = dead.records
    assert isinstance(letter, DeadLetter)
    assert letter.source_topic == Feedback.topic and letter.source_offset == 1
    assert letter.error_type == "malformed" and letter.reason and letter.payload == b"\x93not a record"
    refetches = {r.value for r in health.records if isinstance(r, Health) and r.metric == "recovery_refetches"}
    assert refetches == {0.0}, refetches  # a healthy worker's recoveries never stalled
    lags = [r for r in health.records if isinstance(r, Health) and r.metric == "consumer_lag"]
    assert lags and lags[0].labels["topic"] == topic_prefix + Feedback.topic
