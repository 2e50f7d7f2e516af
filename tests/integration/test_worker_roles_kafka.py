"""Scaled out: two `--role requests` workers and one `--role aggregates` worker, on a real broker.

The topics are keyed by request id, so each of several workers reads some partitions. A fallback
rate is a count over every request of a model and route: with two `--role all` workers each would
publish the window under the same event id with its share of the counts. Here the per-request
processors run in two workers of one group and the aggregating ones in a worker of their own group,
which reads every partition: each minute's window is published with the whole counts (what one
in-process pass counts), by that worker only, and it reports that it holds every partition.
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
from tests.integration.test_worker_catch_up_kafka import _backlog

pytestmark = pytest.mark.kafka


def _fallback_windows(records: list) -> list[tuple[str, str, str]]:
    """(window_start, requests, fallbacks) of every 1-minute fallback-rate record, tier ``*``, as published."""
    return [(h.labels["window_start"], h.labels["requests"], h.labels["fallbacks"]) for h in records
            if isinstance(h, Health) and h.metric == "fallback_rate_1m" and h.labels.get("tier") == "*"]


def _not_held(records: list) -> dict[tuple[str, str], float]:
    """(app without the topic prefix, processor) -> the newest ``aggregate_partitions_not_held`` it reported."""
    return {(h.labels["app"].rsplit(".", 1)[-1], h.labels["processor"]): h.value for h in records
            if isinstance(h, Health) and h.metric == "aggregate_partitions_not_held"}


def _reading_audits(records: list) -> set[str]:
    """The workers (node ids) that reported consumer lag on an audit partition: those holding one."""
    return {h.node_id for h in records if isinstance(h, Health) and h.metric == "consumer_lag"
            and h.labels.get("topic", "").endswith(".entroloop.audit.v1")}


def test_two_request_workers_and_one_aggregating_worker_publish_whole_windows(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    settings = Settings()
    ensure_topics(kafka_bootstrap, topic_prefix, settings.partitions)
    end = float(int((time.time() - 2) // 60 * 60))
    burst = [r for r in _backlog(end - 60) if r.emitted_at < end]  # 300 requests on every partition, 30 fallbacks
    monitor = FallbackRateMonitor.from_settings(settings)
    reference = [w for w in _fallback_windows(monitor.process_batch(burst) + monitor.on_watermark(end + 3600))
                 if w[0] == f"{end - 60:.0f}"]
    assert reference == [(f"{end - 60:.0f}", "300", "30")]
    health = TopicReader(kafka_bootstrap, topic_prefix + Health.topic)
    fast_health = {"ENTROLOOP_STREAMS_HEALTH_INTERVAL_S": "1"}
    for folder in ("requests-0", "requests-1", "aggregates"):
        (tmp_path / folder).mkdir()  # each worker's own data folder (Faust's table stores)
    workers = [start_worker(kafka_bootstrap, topic_prefix, tmp_path / f"requests-{i}", role="requests",
                            extra_env=fast_health)[0] for i in range(2)]
    workers.append(start_worker(kafka_bootstrap, topic_prefix, tmp_path / "aggregates", role="aggregates",
                                extra_env=fast_health)[0])
    try:
        # Publish once every worker holds partitions (the group has settled), so each reads its
        # share of the burst: a worker that read everything before the others joined would count
        # whole windows whatever its role.
        settled = health.read_until(lambda records: len(_reading_audits(records)) == len(workers), timeout=90)
        assert settled, f"workers reading audits: {_reading_audits(health.records)}"
        publish(kafka_bootstrap, topic_prefix, burst)
        started = time.monotonic()
        wait = settings.window_grace_s + settings.streams_watermark_idle_s + 60
        health.read_until(lambda records: any(w[0] == reference[0][0] for w in _fallback_windows(records))
                          and ("entroloop-streams-aggregates", "fallback_rates") in _not_held(records), timeout=wait)
        print(f"window and health after {time.monotonic() - started:.1f} s")
        time.sleep(3)  # a partial window from another worker would come within the same grace
        health.read_until(lambda records: False, timeout=0.5)
        published = [w for w in _fallback_windows(health.records) if w[0] == reference[0][0]]
        not_held = _not_held(health.records)
    finally:
        health.close()
        for worker in workers:
            worker.kill()
    logs = "\n".join(worker.log_tail(1500) for worker in workers)
    assert published and set(published) == set(reference), f"published {published}, expected {reference}\n{logs}"
    assert {app for app, _ in not_held} == {"entroloop-streams-aggregates"}, not_held  # only that worker aggregates
    assert not_held[("entroloop-streams-aggregates", "fallback_rates")] == 0, not_held
    assert all("--role aggregates" not in worker.log_text() for worker in workers), logs
