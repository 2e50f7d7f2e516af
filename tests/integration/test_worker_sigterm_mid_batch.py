"""A worker stopped with SIGTERM (a deploy, a scale-down) in the middle of batches loses nothing.

The crash of a Faust service cancels the agents mid-batch, Faust acknowledges their batches and the
stopping consumer commits them (tests/integration/test_worker_fetcher_crash.py). After a SIGTERM the
worker's log shows no agent cancelled (no ``CancelledError``), and the code before
``streams/faust_batches.py`` lost nothing here (2 of 2 runs). This test keeps it so, and shows that finishing batches on a
cancellation does not slow a graceful stop into the watchdog: exit code 0. Sends are slowed
(``tests.integration.fault_injected_worker_main``) so the signal finds batches in flight.
"""

from __future__ import annotations

import signal
from pathlib import Path

import tests.integration.test_fleet_worker_kafka as fleet_worker
from entroloop.contract.records import Alert


def test_a_worker_sigtermed_mid_batch_commits_only_what_it_finished(
        kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    fleet_worker.publish_fleet(kafka_bootstrap, topic_prefix, 600, 5, tmp_path / "spool")
    expected = fleet_worker.expected_entropy_alerts(kafka_bootstrap, topic_prefix)
    reader = fleet_worker.AlertReader(kafka_bootstrap, topic_prefix + Alert.topic)
    slow, slow_log = fleet_worker.start_worker(
        kafka_bootstrap, topic_prefix, tmp_path, module="tests.integration.fault_injected_worker_main",
        extra_env={"ENTROLOOP_TEST_SLOW_SEND_S": "1.0"})
    worker = None
    try:
        # wait until the slow worker is consuming (its first alerts), then stop it mid-batch
        while not reader.ids and slow.poll() is None:
            reader.read(0.2)
        assert slow.poll() is None, slow.log_tail()
        assert len(set(reader.ids)) < len(expected), "the slow worker finished before it could be stopped"
        slow.send_signal(signal.SIGTERM)
        code = slow.wait(timeout=60)
        assert code == 0, slow.log_tail()
        stopped_with = len(set(reader.ids))

        worker, log_path = fleet_worker.start_worker(kafka_bootstrap, topic_prefix, tmp_path)
        complete = reader.read_until_complete(expected, timeout=180, worker=worker)
        assert complete, fleet_worker.missing_alerts_report(kafka_bootstrap, topic_prefix,
                                                            expected - set(reader.ids), log_path)
        print(f"alerts published when the slow worker was stopped: {stopped_with} of {len(expected)}")
    finally:
        reader.consumer.close()
        slow.kill()
        if worker is not None:
            worker.kill()
