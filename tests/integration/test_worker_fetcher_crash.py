"""A worker whose Kafka fetcher crashes mid-stream exits non-zero, and its replacement loses nothing.

Before ``entroloop.streams.stop_watchdog`` such a worker hung for ever in its own stop: alive,
consuming nothing, deaf to SIGTERM (what CI run G saw after a seek raced the consumer thread). The
fault is injected by ``tests.integration.fault_injected_worker_main``: one ``KeyError`` out of
aiokafka's ``fetched_records`` after the worker has fetched some records.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from entroloop.streams.stop_watchdog import EXIT_STOP_HUNG

import tests.integration.test_fleet_worker_kafka as fleet_worker
from entroloop.contract.records import Alert

GRACE_S = 5


def test_a_worker_whose_fetcher_crashed_exits_and_its_replacement_loses_nothing(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    fleet_worker.publish_fleet(kafka_bootstrap, topic_prefix, 600, 5, tmp_path / "spool")
    expected = fleet_worker.expected_entropy_alerts(kafka_bootstrap, topic_prefix)
    reader = fleet_worker.AlertReader(kafka_bootstrap, topic_prefix + Alert.topic)
    grace = {"ENTROLOOP_STREAMS_STOP_GRACE_S": str(GRACE_S)}
    faulty, faulty_log = fleet_worker.start_worker(
        kafka_bootstrap, topic_prefix, tmp_path, module="tests.integration.fault_injected_worker_main",
        extra_env={**grace, "ENTROLOOP_TEST_FETCH_FAULT_AFTER": "300", "ENTROLOOP_TEST_SLOW_SEND_S": "0.5"})
    worker = None
    try:
        try:
            code = faulty.wait(timeout=120)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the worker whose fetcher crashed is still running:\n{faulty.log_tail()}") from None
        log = faulty_log.read_text(errors="replace")
        assert "Crashed reason=KeyError('injected fetcher fault')" in log, log[-4000:]
        # exit 70: it hung in its stop and the watchdog ended it; 1: Faust's stop completed and re-raised
        print(f"the worker whose fetcher crashed exited with code {code}")
        assert code in (EXIT_STOP_HUNG, 1), (code, log[-4000:])
        if code == EXIT_STOP_HUNG:
            assert f"did not stop within {GRACE_S} s after KeyError('injected fetcher fault')" in log, log[-4000:]

        worker, log_path = fleet_worker.start_worker(kafka_bootstrap, topic_prefix, tmp_path)
        complete = reader.read_until_complete(expected, timeout=180, worker=worker)
        assert complete, fleet_worker.missing_alerts_report(kafka_bootstrap, topic_prefix,
                                                            expected - set(reader.ids), log_path)
        started = time.monotonic()
        worker.kill(15, timeout=60)  # a healthy worker still stops by itself on SIGTERM (default grace: 30 s)
        print(f"healthy worker stopped in {time.monotonic() - started:.1f} s")
        assert worker.proc.returncode == 0, worker.log_tail()
    finally:
        reader.consumer.close()
        faulty.kill()
        if worker is not None:
            worker.kill()
