"""A worker that starts behind a backlog closes each window with every partition's events in it.

Ten minutes of audits and fallbacks wait in Kafka, spread over the partitions by request id, when
`entroloop worker` starts. It reads one partition's batch (minutes of event time) before the
next partition's. With the watermark taken as the newest event time seen anywhere, the windows
the first batch passed closed before the other partitions' events for them arrived: those were
dropped as late and the fallback-rate windows under-counted. The watermark now waits for the
slowest partition heard from (``streams.app.WatermarkCadence``): every window the worker closes
must count what the processor counts in one in-process pass over the same records.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from entroloop.streams.fallback_rates import FallbackRateMonitor

from entroloop.contract.ids import NodeStamper
from entroloop.contract.records import Audit, Event, Fallback, Health
from entroloop.contract.settings import Settings
from entroloop.infra.kafka_topics import ensure_topics
from tests.integration.test_bad_case_join_restart import (
    APP_ID,
    committed_total,
    publish,
)
from tests.integration.test_fleet_worker_kafka import start_worker
from tests.integration.test_streams_worker_kafka import TopicReader

pytestmark = pytest.mark.kafka

REQUESTS = 3000
SPACING_S = 0.2  # 3,000 requests over ten minutes of event time


def _backlog(start: float) -> list[Event]:
    stamper, records = NodeStamper("node-catch-up"), []
    for i in range(REQUESTS):
        at = start + i * SPACING_S
        records.append(Audit(**{**stamper.stamp(), "emitted_at": at, "request_id": f"req-{i}"}, audit_id=f"a-{i}",
                             model="m", route="r", prompt="余额多少?", response="您的余额为120.00元。"))
        if i % 10 == 0:
            records.append(Fallback(**{**stamper.stamp(), "emitted_at": at + 0.05, "request_id": f"req-{i}"},
                                    model="m", route="r", reason="timeout"))
    return records


def _windows(records: list[Event]) -> dict[str, tuple[str, str]]:
    """window_start -> (requests, fallbacks) of the 1-minute fallback-rate windows, tier ``*``."""
    return {h.labels["window_start"]: (h.labels["requests"], h.labels["fallbacks"]) for h in records
            if isinstance(h, Health) and h.metric == "fallback_rate_1m" and h.labels.get("tier") == "*"}


def _late(records: list[Event]) -> float | None:
    """The fallback-rate processor's late events in the newest Health record that reports them."""
    reports = [h.value for h in records if isinstance(h, Health) and h.metric == "late_events"
               and h.labels.get("processor") == FallbackRateMonitor.name]
    return reports[-1] if reports else None


def test_a_worker_behind_a_backlog_closes_windows_with_every_partitions_events(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    settings = Settings()
    ensure_topics(kafka_bootstrap, topic_prefix, settings.partitions)
    start = float(int(time.time() // 60 * 60)) - 3600  # minute-aligned, an hour ago
    backlog = _backlog(start)
    monitor = FallbackRateMonitor.from_settings(settings)
    reference = _windows(monitor.process_batch(backlog) + monitor.on_watermark(start + 3600))
    publish(kafka_bootstrap, topic_prefix, backlog)
    health = TopicReader(kafka_bootstrap, topic_prefix + Health.topic)
    worker, _ = start_worker(kafka_bootstrap, topic_prefix, tmp_path,
                             extra_env={"ENTROLOOP_STREAMS_HEALTH_INTERVAL_S": "0.5"})
    try:
        deadline = time.monotonic() + 120
        while committed_total(kafka_bootstrap, topic_prefix + APP_ID, topic_prefix + Audit.topic,
                              settings.partitions) < REQUESTS:
            assert worker.poll() is None, f"worker died:\n{worker.log_tail()}"
            assert time.monotonic() < deadline, f"the audits were not all committed:\n{worker.log_tail()}"
            time.sleep(0.5)
        # Once every partition has been silent past the idle time, one audit two minutes after the
        # backlog closes all of its windows at once (without it they would close as wall time
        # passes them: test_worker_idle_windows_kafka.py).
        time.sleep(Settings().streams_watermark_idle_s + 0.5)
        tick = _backlog(start + REQUESTS * SPACING_S + 120)[0]
        publish(kafka_bootstrap, topic_prefix, [tick])
        health.read_until(lambda records: set(reference) <= set(_windows(records)), timeout=30)
        got = _windows(health.records)
        health.read_until(lambda records: _late(records) is not None, timeout=10)
        late = _late(health.records)
    finally:
        health.close()
        worker.kill()
    assert len(reference) >= 10, reference
    wrong = {w: (got.get(w), reference[w]) for w in sorted(reference) if got.get(w) != reference[w]}
    assert not wrong, f"windows (requests, fallbacks) worker vs in-process: {wrong}\n{worker.log_tail()}"
    assert late == 0, f"the fallback-rate processor dropped {late} events as late"
