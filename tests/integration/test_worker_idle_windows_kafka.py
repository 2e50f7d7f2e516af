"""When the traffic stops, the worker still closes the last window and publishes its figures.

Windows close when the watermark passes their end plus the grace period, and the watermark used to
move only with later events: the last minute of a burst (its fallback rate, its alerts) waited for
the next request, minutes or hours on a quiet deployment. Once every input partition has been
silent for ``ENTROLOOP_STREAMS_WATERMARK_IDLE_S`` and the broker confirms that everything was read,
event time goes on with wall time (``streams.app.WatermarkCadence``). Here one minute of audits and
fallbacks is published, nothing after it, and the worker must publish that minute's fallback rate,
counting what the processor counts in one in-process pass.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from entroloop.streams.fallback_rates import FallbackRateMonitor

from entroloop.contract.records import Health
from entroloop.contract.settings import Settings
from entroloop.infra.kafka_topics import ensure_topics
from tests.integration.test_bad_case_join_restart import publish
from tests.integration.test_fleet_worker_kafka import start_worker
from tests.integration.test_streams_worker_kafka import TopicReader
from tests.integration.test_worker_catch_up_kafka import _backlog, _windows

pytestmark = pytest.mark.kafka


def test_the_last_window_closes_when_the_traffic_stops(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    settings = Settings()
    ensure_topics(kafka_bootstrap, topic_prefix, settings.partitions)
    # One minute of traffic that ended a moment ago (a minute boundary at least 2 s back).
    end = float(int((time.time() - 2) // 60 * 60))
    burst = [r for r in _backlog(end - 60) if r.emitted_at < end]  # 300 requests 0.2 s apart, 30 fallbacks
    monitor = FallbackRateMonitor.from_settings(settings)
    closed = _windows(monitor.process_batch(burst) + monitor.on_watermark(end + 3600))
    # The burst's minute; the empty minutes after it (5-minute windows slide past the data) close
    # later, as wall time passes them.
    reference = {start: closed[start] for start in closed if start == f"{end - 60:.0f}"}
    assert reference == {f"{end - 60:.0f}": ("300", "30")}, closed
    health = TopicReader(kafka_bootstrap, topic_prefix + Health.topic)
    worker, _ = start_worker(kafka_bootstrap, topic_prefix, tmp_path)
    try:
        publish(kafka_bootstrap, topic_prefix, burst)
        # Nothing is published after the burst. Silent for the idle time, caught up, the watermark
        # moves on with the clock: the minute closes after its grace (5 s) plus the idle time (2 s).
        wait = settings.window_grace_s + settings.streams_watermark_idle_s + 30
        health.read_until(lambda records: set(reference) <= set(_windows(records)), timeout=wait)
        got = _windows(health.records)
    finally:
        health.close()
        worker.kill()
    wrong = {w: (got.get(w), reference[w]) for w in sorted(reference) if got.get(w) != reference[w]}
    assert not wrong, f"windows (requests, fallbacks) worker vs in-process: {wrong}\n{worker.log_tail()}"
