"""The bad-case join survives a worker crash: its state is recovered from the table's changelog.

Before the crash the worker sees one half of every pair: the audits of the ``audit-first``
requests, the corrected feedback of the ``feedback-first`` requests, and one audit so old that
the TTL expires it. The worker is SIGKILLed and restarted; then the other halves arrive. With the
changelogged table every correction yields exactly one bad case (one event id, however many copies
at-least-once delivery publishes) and the expired request none (its
tombstone is in the changelog, so recovery does not bring it back). The control runs the same
join on a plain dict: the restarted worker has forgotten every first half and yields none.
"""

from __future__ import annotations

import collections
import time
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from entroloop.contract import codec
from entroloop.contract.ids import NodeStamper
from entroloop.contract.records import Audit, BadCase, Event, Feedback
from entroloop.contract.topics import TOPIC_BY_TYPE
from entroloop.infra.kafka_topics import ensure_topics
from tests.integration.test_streams_worker_kafka import TopicReader, produce
from tests.integration.worker_process import WorkerProcess

pytestmark = pytest.mark.kafka

PARTITIONS = 2  # more than one, so the changelog partition of each key matters
PAIRS = 20  # requests per arrival order
TTL_S = 3600.0
APP_ID = "entroloop-streams"  # StreamsConfig's default app id (prefixed)
RESPONSE = "您的账户余额为120.00元，到期日2024-03-05。"
CORRECTION = "您的账户余额为150.00元，到期日2024-03-05。"


def join_worker(tmp: Path, bootstrap: str, prefix: str, state: str) -> WorkerProcess:
    """One bad-case worker process (``bad_case_worker_main``)."""
    return WorkerProcess(tmp, "tests.integration.bad_case_worker_main", bootstrap, prefix, str(PARTITIONS), state,
                         str(TTL_S), env={"ENTROLOOP_FAUST_DATADIR": str(tmp / "faust")}, name="join-worker")


def committed_total(bootstrap: str, group: str, topic: str, partitions: int = PARTITIONS) -> int:
    """Sum of the group's committed offsets over the topic's partitions (= records acknowledged)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        offsets = consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=10)
    finally:
        consumer.close()
    return sum(max(tp.offset, 0) for tp in offsets)


def wait_committed(bootstrap: str, prefix: str, wanted: dict[str, int], worker: WorkerProcess, timeout: float) -> None:
    """Wait until the worker acknowledged ``wanted[topic]`` records of each input topic."""
    deadline = time.monotonic() + timeout
    while True:
        done = {t: committed_total(bootstrap, prefix + APP_ID, prefix + t) for t in wanted}
        if all(done[t] >= n for t, n in wanted.items()):
            return
        assert worker.proc.poll() is None, f"worker died; log:\n{worker.log_tail()}"
        assert time.monotonic() < deadline, f"acknowledged {done}, wanted {wanted}; log:\n{worker.log_tail()}"
        time.sleep(0.5)


def make_audit(stamper: NodeStamper, request_id: str, emitted_at: float | None = None) -> Audit:
    common = stamper.stamp()
    if emitted_at is not None:
        common["emitted_at"] = emitted_at
    return Audit(**{**common, "request_id": request_id}, audit_id=f"audit-{request_id}", model="m",
                 prompt="余额?", response=RESPONSE)


def make_feedback(stamper: NodeStamper, request_id: str) -> Feedback:
    return Feedback(**{**stamper.stamp(), "request_id": request_id}, rating=1, error_type="numbers",
                    corrected_answer=CORRECTION)


def publish(bootstrap: str, prefix: str, records: list[Event]) -> None:
    by_topic: dict[str, list[tuple[bytes, bytes]]] = collections.defaultdict(list)
    for r in records:
        by_topic[prefix + r.topic].append((r.request_id.encode(), codec.encode(r)))
    for topic, items in by_topic.items():
        produce(bootstrap, topic, items)


def changelog_last_values(bootstrap: str, topic: str, expected_keys: int) -> dict[bytes, bytes | None]:
    """The last value per key of the table's changelog (None: a tombstone)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"changelog-{time.time_ns()}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe([topic])
    last: dict[bytes, bytes | None] = {}
    deadline = time.monotonic() + 20
    try:
        while time.monotonic() < deadline and len(last) < expected_keys:
            for message in consumer.consume(1000, timeout=0.5):
                if message.error() is None:
                    last[message.key()] = message.value()
        for message in consumer.consume(1000, timeout=1.0):  # anything after the expected keys
            if message.error() is None:
                last[message.key()] = message.value()
    finally:
        consumer.close()
    return last


def run_restart_scenario(bootstrap: str, prefix: str, tmp: Path, state: str) -> tuple[list[BadCase], dict[str, object]]:
    ensure_topics(bootstrap, prefix, partitions=PARTITIONS, topics=[TOPIC_BY_TYPE[t] for t in (Audit, Feedback, BadCase)])
    stamper = NodeStamper("node-join-test")
    audit_first = [f"audit-first-{i}" for i in range(PAIRS)]
    feedback_first = [f"feedback-first-{i}" for i in range(PAIRS)]
    now = time.time()
    before = [make_audit(stamper, "expired", emitted_at=now - 10 * TTL_S)]
    before += [make_audit(stamper, rid) for rid in audit_first]
    before += [make_feedback(stamper, rid) for rid in feedback_first]
    after = [make_feedback(stamper, rid) for rid in audit_first]
    after += [make_audit(stamper, rid) for rid in feedback_first]
    after += [make_feedback(stamper, "expired")]

    figures: dict[str, object] = {"state": state}
    cases = TopicReader(bootstrap, prefix + BadCase.topic)
    started = time.monotonic()
    try:
        first = join_worker(tmp, bootstrap, prefix, state)
        publish(bootstrap, prefix, before)
        wait_committed(bootstrap, prefix, {Audit.topic: PAIRS + 1, Feedback.topic: PAIRS}, first, timeout=90)
        figures["first_worker_s"] = round(time.monotonic() - started, 1)
        first.kill()
        if state == "table":
            changelog = changelog_last_values(
                bootstrap, f"{prefix}{APP_ID}-bad_case_join-changelog", expected_keys=2 * PAIRS + 1
            )
            figures["changelog_keys"] = sum(v is not None for v in changelog.values())
            figures["expired_tombstone"] = b"expired" in changelog and changelog[b"expired"] is None

        restarted_at = time.monotonic()
        second = join_worker(tmp, bootstrap, prefix, state)
        publish(bootstrap, prefix, after)
        wait_committed(bootstrap, prefix, {Audit.topic: 2 * PAIRS + 1, Feedback.topic: 2 * PAIRS + 1}, second,
                       timeout=120)
        figures["second_worker_s"] = round(time.monotonic() - restarted_at, 1)
        # Outputs are flushed to the broker before their inputs are acknowledged: once every input
        # is acknowledged, every bad case is on the topic; a short read collects them all.
        cases.read_until(lambda rs: len(rs) >= 2 * PAIRS + 1, timeout=5 if state == "table" else 3)
        second.kill()
    finally:
        cases.close()
    bad_cases = [r for r in cases.records if isinstance(r, BadCase)]
    figures["bad_cases"] = len(bad_cases)
    figures["total_s"] = round(time.monotonic() - started, 1)
    print(f"\n{figures}")
    return bad_cases, figures


def test_join_state_is_recovered_from_the_changelog_after_a_kill(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    bad_cases, figures = run_restart_scenario(kafka_bootstrap, topic_prefix, tmp_path, "table")
    assert figures["changelog_keys"] == 2 * PAIRS, figures  # one live entry per waiting request
    assert figures["expired_tombstone"] is True, figures  # expiry deleted the entry: a tombstone
    # At-least-once: a bad case may be published twice (Faust hands the records it prefetched during
    # the table's recovery over again, and a replayed input makes its bad case again, on purpose:
    # the first copy may never have reached the broker), but every copy of one correction's bad
    # case is the same record, so the sinks' event-id dedup stores it once.
    copies: dict[str, set[bytes]] = collections.defaultdict(set)
    for case in bad_cases:
        copies[case.event_id].add(codec.encode(case))
    assert all(len(kinds) == 1 for kinds in copies.values()), "two different records under one event id"
    per_request = collections.Counter(case.request_id for case in {c.event_id: c for c in bad_cases}.values())
    wanted = {f"audit-first-{i}" for i in range(PAIRS)} | {f"feedback-first-{i}" for i in range(PAIRS)}
    assert set(per_request) == wanted, f"missing {wanted - set(per_request)}, extra {set(per_request) - wanted}"
    assert all(n == 1 for n in per_request.values()), per_request.most_common(3)  # one bad case per correction
    assert all(case.correction == CORRECTION and "number" in case.labels for case in bad_cases)


def test_control_a_join_on_a_plain_dict_forgets_everything_across_the_kill(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    """Without the table the same scenario yields no bad case: the test above can fail."""
    bad_cases, _ = run_restart_scenario(kafka_bootstrap, topic_prefix, tmp_path, "dict")
    assert bad_cases == []
