"""An aggregates worker SIGKILLed in the middle of a minute publishes that whole minute after its restart.

The fallback-rate monitor counts every request of a minute in memory, and the worker commits its
inputs every half second here: before the aggregating processors kept snapshots, the first half of
the minute died with the process and the restarted worker published the window short (the control
run, snapshots off: 0 of 300 requests and 15 of 30 fallbacks; the killed worker had acknowledged
every audit and the first fallbacks, what it had counted went with it). Now each batch's snapshot,
with the input offsets it covers, goes out before the batch is acknowledged; the restarted worker
(a fresh data folder: its state comes from the broker) restores it and skips what it covers.

The minute is kept open while the worker is killed (``ENTROLOOP_STREAMS_WATERMARK_IDLE_S`` far
above the test's length: silence does not close it) and closed afterwards by traffic two minutes
later on every partition.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from entroloop.streams.fallback_rates import FallbackRateMonitor

from entroloop.contract.records import Audit, Fallback, Health
from entroloop.contract.settings import Settings
from entroloop.infra.kafka_topics import ensure_topics
from tests.integration.test_bad_case_join_restart import committed_total, publish
from tests.integration.test_fleet_worker_kafka import start_worker
from tests.integration.test_streams_worker_kafka import TopicReader
from tests.integration.test_worker_catch_up_kafka import _backlog

pytestmark = pytest.mark.kafka

GROUP = "entroloop-streams-aggregates"  # the aggregates role's consumer group (prefixed)


def _minute(records: list, start: float) -> list[tuple[str, str]]:
    """(requests, fallbacks) of every published 1-minute window starting at ``start``, tier ``*``."""
    return [(h.labels["requests"], h.labels["fallbacks"]) for h in records
            if isinstance(h, Health) and h.metric == "fallback_rate_1m" and h.labels.get("tier") == "*"
            and h.labels["window_start"] == f"{start:.0f}"]


def _wait_committed(bootstrap: str, prefix: str, wanted: dict[str, int], worker, partitions: int) -> None:
    deadline = time.monotonic() + 120
    while True:
        done = {topic: committed_total(bootstrap, prefix + GROUP, prefix + topic, partitions) for topic in wanted}
        if all(done[topic] >= n for topic, n in wanted.items()):
            return
        assert worker.proc.poll() is None, f"worker died; log:\n{worker.log_tail()}"
        assert time.monotonic() < deadline, f"committed {done}, wanted {wanted}; log:\n{worker.log_tail()}"
        time.sleep(0.3)


def _published_minute(health: TopicReader, start: float) -> tuple[bool, list[tuple[str, str]]]:
    """Wait for the minute's window; then every copy of it published (a second copy, the same id,
    would come with the same watermark)."""
    published = health.read_until(lambda records: bool(_minute(records, start)), timeout=120)
    time.sleep(2)
    health.read_until(lambda records: False, timeout=0.5)
    return published, _minute(health.records, start)


def _stop(health: TopicReader, worker, restarted) -> None:  # type: ignore[no-untyped-def]
    health.close()
    worker.kill()
    if restarted is not None:
        restarted.kill()


def _counts(records: list) -> dict[str, int]:
    """Records per input topic of the aggregates worker (what its group must have committed)."""
    return {Audit.topic: sum(isinstance(r, Audit) for r in records),
            Fallback.topic: sum(isinstance(r, Fallback) for r in records)}


def _logs(worker, restarted) -> str:  # type: ignore[no-untyped-def]
    return worker.log_tail(1500) + "\n----- restarted -----\n" + (restarted.log_tail(3000) if restarted else "")


def test_an_aggregates_worker_killed_mid_minute_publishes_the_whole_minute(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    settings = Settings()
    ensure_topics(kafka_bootstrap, topic_prefix, settings.partitions)
    start = float(int((time.time() - 600) // 60 * 60))  # a minute in the past: no clock cap on its records
    minute = [r for r in _backlog(start) if r.emitted_at < start + 60]  # 300 requests, 30 fallbacks, every partition
    first, second = [r for r in minute if r.emitted_at < start + 30], [r for r in minute if r.emitted_at >= start + 30]
    closers = [r for r in _backlog(start + 120) if r.emitted_at < start + 180]  # the same request ids: every partition
    monitor = FallbackRateMonitor.from_settings(settings)
    assert _minute(monitor.process_batch(minute) + monitor.on_watermark(start + 3600), start) == [("300", "30")]

    env = {"ENTROLOOP_STREAMS_WATERMARK_IDLE_S": "3600"}
    health = TopicReader(kafka_bootstrap, topic_prefix + Health.topic)
    (tmp_path / "before").mkdir()
    (tmp_path / "after").mkdir()
    worker, _ = start_worker(kafka_bootstrap, topic_prefix, tmp_path / "before", role="aggregates", extra_env=env)
    restarted = None
    try:
        publish(kafka_bootstrap, topic_prefix, first)
        _wait_committed(kafka_bootstrap, topic_prefix, _counts(first), worker, settings.partitions)
        publish(kafka_bootstrap, topic_prefix, second)
        worker.kill()  # SIGKILL: whatever of the second half it took is neither acknowledged nor snapshotted for sure
        restarted, _ = start_worker(kafka_bootstrap, topic_prefix, tmp_path / "after", role="aggregates", extra_env=env)
        # The closers only once the restarted worker has taken the whole minute: records it skips while
        # Faust recovers come again ~5 s later (the offset guard), after any that followed them, and a
        # minute closed by those would count them late (a recovery-ordering limit, not the snapshot's).
        _wait_committed(kafka_bootstrap, topic_prefix, _counts(minute), restarted, settings.partitions)
        publish(kafka_bootstrap, topic_prefix, closers)
        published, windows = _published_minute(health, start)
    finally:
        _stop(health, worker, restarted)
    logs = _logs(worker, restarted)
    assert published, f"no window for {start:.0f}\n{logs}"
    assert set(windows) == {("300", "30")}, f"published {windows}, expected the whole minute 300 / 30\n{logs}"
    assert "state restored" in restarted.log_text(), logs


def test_an_aggregates_worker_restarted_into_silence_publishes_the_restored_minute(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    """Killed after its whole minute was committed, restarted with no record to come: no batch
    reaches the restarted worker, so the snapshot is restored by its idle timer, with the newest
    event time, and the minute closes once the inputs have been silent for ``idle_s`` (before, it
    waited for the next request: minutes or hours on a quiet deployment)."""
    settings = Settings()
    ensure_topics(kafka_bootstrap, topic_prefix, settings.partitions)
    start = float(int((time.time() - 600) // 60 * 60))
    minute = [r for r in _backlog(start) if r.emitted_at < start + 60]
    health = TopicReader(kafka_bootstrap, topic_prefix + Health.topic)
    (tmp_path / "before").mkdir()
    (tmp_path / "after").mkdir()
    # The first worker must not close the minute itself: silence does not advance its event time.
    worker, _ = start_worker(kafka_bootstrap, topic_prefix, tmp_path / "before", role="aggregates",
                             extra_env={"ENTROLOOP_STREAMS_WATERMARK_IDLE_S": "3600"})
    restarted = None
    try:
        publish(kafka_bootstrap, topic_prefix, minute)
        _wait_committed(kafka_bootstrap, topic_prefix, _counts(minute), worker, settings.partitions)
        time.sleep(1.0)  # commits follow the snapshot's hand-over; let the last one settle too
        worker.kill()
        health.read_until(lambda records: False, timeout=0.5)
        assert not _minute(health.records, start), "the first worker closed the minute: nothing to restore"
        restarted, _ = start_worker(kafka_bootstrap, topic_prefix, tmp_path / "after", role="aggregates",
                                    extra_env={"ENTROLOOP_STREAMS_WATERMARK_IDLE_S": "2"})
        published, windows = _published_minute(health, start)
    finally:
        _stop(health, worker, restarted)
    logs = _logs(worker, restarted)
    assert published, f"the restored minute {start:.0f} was never published\n{logs}"
    assert set(windows) == {("300", "30")}, f"published {windows}, expected the whole minute 300 / 30\n{logs}"
