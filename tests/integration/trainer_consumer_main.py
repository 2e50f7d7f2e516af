"""The Kafka trainer with fake, torch-free steps, as its own process so a test can SIGKILL it.

    python -m tests.integration.trainer_consumer_main ROOT [--once]

Settings come from ``ENTROLOOP_*`` (broker, topic prefix, partitions, data dir). Jobs live in
``ROOT/jobs``; every step appends its name and trigger key to ``ROOT/calls.log``. While the file
``ROOT/hang`` exists the ``train`` step marks the job ``progress=hanging`` and waits (the test kills
the process then). ``TRAINER_KILL_BEFORE_COMMIT=1`` SIGKILLs the process right after its first
claim, before the offset commit. The consumer is the CLI's own (``run_kafka_trainer``); only the
steps are fakes. The final counters are printed as one JSON line.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

from entroloop.training.consumer import RetrainConsumer
from entroloop.training.jobs import JobRunner, JobStore, Step

from entroloop.cli.training import _actions, run_kafka_trainer
from entroloop.contract.settings import load_settings


def fake_steps(root: Path) -> list[Step]:
    def make(name: str):
        def run(job) -> dict:
            with open(root / "calls.log", "a") as fh:
                fh.write(f"{name} {job.trigger_key}\n")
            if name == "train" and (root / "hang").exists():
                job.update(progress="hanging")
                while (root / "hang").exists():
                    time.sleep(0.05)
            return {"step": name}
        return Step(name, run)

    return [make("dataset"), make("train"), make("gate")]


def main() -> None:
    root = Path(sys.argv[1])
    once = "--once" in sys.argv[2:]
    if os.environ.get("TRAINER_KILL_BEFORE_COMMIT") == "1":
        def die(self, message) -> None:  # the claim is on disk, the offset is not committed
            print("fault: SIGKILL after the claim, before its commit", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        RetrainConsumer._commit = die  # type: ignore[method-assign]
    settings = load_settings()
    runner = JobRunner(JobStore(root), fake_steps(root), _actions(settings))
    stats = run_kafka_trainer(settings, runner, once=once, session_timeout_s=6.0)
    from prometheus_client import (
        REGISTRY,  # what a scrape of ENTROLOOP_METRICS_PORT would show
    )

    from entroloop.contract.records import RetrainRequest

    labels = {"component": "trainer", "topic": RetrainRequest.topic}
    stats["metrics"] = {
        "events_in": REGISTRY.get_sample_value("entroloop_events_in_total", labels),
        "dead_letters": REGISTRY.get_sample_value("entroloop_dead_letters_total", labels),
        "last_commit": REGISTRY.get_sample_value("entroloop_last_commit_timestamp_seconds", {"component": "trainer"}),
    }
    print(json.dumps(stats, default=str), flush=True)


if __name__ == "__main__":
    main()
