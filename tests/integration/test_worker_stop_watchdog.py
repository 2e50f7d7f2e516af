"""A worker whose stop hangs is ended by the stop watchdog with exit code 70, within the grace period.

The hang is injected (``ENTROLOOP_TEST_HANG_STOP``: the Kafka consumer's stop never returns), so the
watchdog's wiring into the real worker is checked every run; the Fetcher crash that hung a stop for
real does so only some of the time (tests/integration/test_worker_fetcher_crash.py).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from entroloop.streams.stop_watchdog import EXIT_STOP_HUNG

import tests.integration.test_fleet_worker_kafka as fleet_worker

GRACE_S = 3


def test_a_worker_whose_stop_hangs_exits_with_70(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    worker, log_path = fleet_worker.start_worker(
        kafka_bootstrap, topic_prefix, tmp_path, module="tests.integration.fault_injected_worker_main",
        extra_env={"ENTROLOOP_STREAMS_STOP_GRACE_S": str(GRACE_S), "ENTROLOOP_TEST_HANG_STOP": "1"})
    try:
        deadline = time.monotonic() + 120
        while "Worker ready" not in log_path.read_text(errors="replace"):
            assert worker.poll() is None and time.monotonic() < deadline, worker.log_tail()
            time.sleep(0.2)
        signalled = time.monotonic()
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=60)
        took = time.monotonic() - signalled
    finally:
        worker.kill()
    log = log_path.read_text(errors="replace")
    assert code == EXIT_STOP_HUNG, (code, log[-4000:])
    assert f"the worker did not stop within {GRACE_S} s after a stop request" in log, log[-4000:]
    assert GRACE_S <= took < GRACE_S + 30, took
