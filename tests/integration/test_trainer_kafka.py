"""`entroloop trainer` against the real broker (fake, torch-free job steps in a subprocess):
one job per trigger key, poison records to the dead-letter topic, a killed trainer resumes its job
without a second one, and every step is an Action record on the actions topic."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from entroloop.training.jobs import JobStore

from entroloop.contract import codec
from entroloop.contract.records import Action, DeadLetter, RetrainRequest
from entroloop.contract.topics import TOPIC_BY_TYPE
from entroloop.infra.kafka_topics import ensure_topics
from tests.integration.conftest import REPO_ROOT
from tests.integration.test_publisher_kafka import consume_all
from tests.unit.training.training_records import feedback, retrain_request
from tests.integration.acknowledged_producer import AcknowledgedProducer

pytestmark = pytest.mark.kafka

PARTITIONS = 2


@pytest.fixture
def trainer_env(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> dict[str, str]:
    ensure_topics(kafka_bootstrap, topic_prefix, PARTITIONS,
                  topics=[TOPIC_BY_TYPE[t] for t in (RetrainRequest, DeadLetter, Action)])
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENTROLOOP_")}
    env.update({
        "ENTROLOOP_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "ENTROLOOP_TOPIC_PREFIX": topic_prefix,
        "ENTROLOOP_PARTITIONS": str(PARTITIONS),
        "ENTROLOOP_DATA_DIR": str(tmp_path / "data"),
        "ENTROLOOP_NODE_ID": "trainer-test",
    })
    return env


def produce(bootstrap: str, prefix: str, items: list[tuple[str, bytes]]) -> None:
    producer = AcknowledgedProducer({"bootstrap.servers": bootstrap, "partitioner": "consistent_random"})
    for key, value in items:
        producer.produce(prefix + RetrainRequest.topic, key=key.encode(), value=value)
    assert producer.flush(30) == 0


def request_bytes(key: str) -> tuple[str, bytes]:
    return key, codec.encode(retrain_request(key))


def start_trainer(env: dict[str, str], root: Path, *args: str, extra_env: dict[str, str] | None = None
                  ) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.integration.trainer_consumer_main", str(root), *args],
        cwd=REPO_ROOT, env={**env, **(extra_env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )


def run_once(env: dict[str, str], root: Path, **kw) -> dict:
    proc = start_trainer(env, root, "--once", **kw)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, out + err
    return json.loads(out.strip().splitlines()[-1])


def calls(root: Path) -> list[str]:
    path = root / "calls.log"
    return path.read_text().splitlines() if path.exists() else []


def actions_on_topic(bootstrap: str, prefix: str, expected: int) -> list[Action]:
    records = consume_all(bootstrap, [prefix + Action.topic], expected, timeout=60)
    return [r for r in records if isinstance(r, Action)]


def test_one_job_per_key_and_poison_to_dead_letters(kafka_bootstrap, topic_prefix, trainer_env, tmp_path) -> None:
    root = tmp_path / "jobs"
    produce(kafka_bootstrap, topic_prefix, [
        request_bytes("model-a/format/1"),
        ("bad", b"\x00 not a record"),
        request_bytes("model-a/format/1"),  # the same trigger again (a new event): no second job
        ("fb", codec.encode(feedback("r-1", 1))),  # a record of another kind on the retrain topic
        request_bytes("model-a/facts/2"),
    ])

    started = time.time()
    stats = run_once(trainer_env, root)

    assert (stats["claimed"], stats["duplicates"], stats["dead_letters"]) == (2, 1, 2), stats
    # the Prometheus counters (ENTROLOOP_METRICS_PORT) say the same
    assert (stats["metrics"]["events_in"], stats["metrics"]["dead_letters"]) == (5, 2), stats["metrics"]
    assert stats["metrics"]["last_commit"] >= started
    assert stats["final_states"] == {"accepted": 2}
    jobs = JobStore(root).jobs()
    assert sorted(j.trigger_key for j in jobs) == ["model-a/facts/2", "model-a/format/1"]
    assert sorted(c for c in calls(root) if c.startswith("dataset")) == [
        "dataset model-a/facts/2", "dataset model-a/format/1"]

    dead = [r for r in consume_all(kafka_bootstrap, [topic_prefix + DeadLetter.topic], 2, timeout=60)
            if isinstance(r, DeadLetter)]
    assert len(dead) == 2
    assert {d.source_topic for d in dead} == {RetrainRequest.topic}
    assert any(d.payload == b"\x00 not a record" for d in dead)
    assert any(d.error_type == "wrong_topic" and "Feedback" in d.reason for d in dead)

    actions = actions_on_topic(kafka_bootstrap, topic_prefix, 9)
    by_key: dict[str, list[str]] = {}
    for a in sorted(actions, key=lambda a: a.seq):
        by_key.setdefault(a.alert_key, []).append(a.action)
    assert by_key["model-a/format/1"].count("retrain.duplicate") == 1
    for key in ("model-a/format/1", "model-a/facts/2"):
        steps = [n for n in by_key[key] if n != "retrain.duplicate"]
        assert steps == ["retrain.claimed", "dataset.completed", "train.completed", "gate.completed"], by_key
    assert all(a.runbook == "entroloop.training" and a.node_id == "trainer@trainer-test" for a in actions)


def wait_for(predicate, timeout: float = 60.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def test_killed_trainer_resumes_its_job_and_starts_no_second(kafka_bootstrap, topic_prefix, trainer_env,
                                                            tmp_path) -> None:
    root = tmp_path / "jobs"
    root.mkdir()
    (root / "hang").touch()
    key = "model-a/format/killed"
    produce(kafka_bootstrap, topic_prefix, [request_bytes(key)])
    proc = start_trainer(trainer_env, root)
    try:
        store = JobStore(root)
        wait_for(lambda: (job := store.get(key)) is not None and job.status().get("progress") == "hanging",
                 what="the job to reach its train step")
        # what the first process published before the crash (the node publisher's queue is in memory)
        assert len(actions_on_topic(kafka_bootstrap, topic_prefix, 2)) == 2
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=30)
    (root / "hang").unlink()
    produce(kafka_bootstrap, topic_prefix, [request_bytes(key)])  # the trigger fires again meanwhile

    stats = run_once(trainer_env, root)

    assert (stats["resumed"], stats["claimed"], stats["duplicates"]) == (1, 0, 1), stats
    jobs = JobStore(root).jobs()
    assert len(jobs) == 1 and jobs[0].state == "accepted" and jobs[0].status()["attempts"] == 2
    assert calls(root) == [f"dataset {key}", f"train {key}", f"train {key}", f"gate {key}"]
    names = [a.action for a in sorted(actions_on_topic(kafka_bootstrap, topic_prefix, 6), key=lambda a: a.emitted_at)
             if a.alert_key == key]
    assert names.count("retrain.claimed") == 1 and names.count("retrain.duplicate") == 1
    assert [n for n in names if n != "retrain.duplicate"] == [
        "retrain.claimed", "dataset.completed", "retrain.resumed", "train.completed", "gate.completed"], names


def test_trainer_killed_between_claim_and_commit(kafka_bootstrap, topic_prefix, trainer_env, tmp_path) -> None:
    root = tmp_path / "jobs"
    key = "model-a/format/uncommitted"
    produce(kafka_bootstrap, topic_prefix, [request_bytes(key)])
    proc = start_trainer(trainer_env, root, "--once", extra_env={"TRAINER_KILL_BEFORE_COMMIT": "1"})
    proc.communicate(timeout=120)
    assert proc.returncode == -signal.SIGKILL
    job = JobStore(root).get(key)
    assert job is not None and job.state == "claimed" and calls(root) == []

    stats = run_once(trainer_env, root)  # re-reads the uncommitted request: a duplicate, and resumes the job

    assert (stats["resumed"], stats["claimed"], stats["duplicates"]) == (1, 0, 1), stats
    jobs = JobStore(root).jobs()
    assert len(jobs) == 1 and jobs[0].state == "accepted"
    assert calls(root) == [f"dataset {key}", f"train {key}", f"gate {key}"]
