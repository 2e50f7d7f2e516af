"""Job store and runner: one job per trigger key, crash resume, steps done once."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path

import pytest
from entroloop.training.actions import ActionLog
from entroloop.training.jobs import JobRunner, JobStore, Step, key_folder_name

from .training_records import retrain_request


def _counting_steps(calls: list[str]) -> list[Step]:
    def make(name: str):
        def run(job):
            calls.append(name)
            return {"name": name}
        return Step(name, run)
    return [make("dataset"), make("train"), make("gate")]


def test_duplicate_trigger_starts_no_second_job(tmp_path: Path) -> None:
    calls: list[str] = []
    actions = ActionLog()
    runner = JobRunner(JobStore(tmp_path), _counting_steps(calls), actions)
    first = runner.submit(retrain_request("k1"))
    second = runner.submit(retrain_request("k1"))
    assert first is not None and first.state == "accepted"
    assert second is None
    assert calls == ["dataset", "train", "gate"]
    assert actions.names("k1") == [
        "retrain.claimed", "dataset.completed", "train.completed", "gate.completed", "retrain.duplicate",
    ]
    assert len(JobStore(tmp_path).jobs()) == 1


def _claim_in_process(root: str, barrier, results) -> None:
    barrier.wait()
    job = JobStore(Path(root)).claim(retrain_request("same-key"))
    results.put(job is not None)


def test_concurrent_claims_of_one_key_make_one_job(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(6), ctx.Queue()
    procs = [ctx.Process(target=_claim_in_process, args=(str(tmp_path), barrier, results)) for _ in range(6)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(20)
    wins = [results.get(timeout=5) for _ in procs]
    assert sum(wins) == 1
    assert len(JobStore(tmp_path).jobs()) == 1
    assert not [p for p in (tmp_path / "jobs").iterdir() if p.name.startswith(".claim")]


def test_key_folder_names_are_safe_and_distinct() -> None:
    a, b = key_folder_name("m/x:../../etc"), key_folder_name("m/x:../../etd")
    assert "/" not in a and ".." not in a and a != b


def _run_and_hang(root: str) -> None:
    def hang(job):
        job.update(progress="half")
        time.sleep(60)
        return {}
    runner = JobRunner(JobStore(Path(root)), [Step("dataset", lambda job: {"rows": 3}), Step("train", hang)], ActionLog())
    runner.submit(retrain_request("crashy"))


def test_killed_job_resumes_after_its_last_finished_step(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    proc = ctx.Process(target=_run_and_hang, args=(str(tmp_path),))
    proc.start()
    store = JobStore(tmp_path)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        job = store.get("crashy")
        if job is not None and job.status().get("progress") == "half":
            break
        time.sleep(0.05)
    assert job is not None and job.is_locked()
    assert store.resumable() == []  # a live process holds it
    os.kill(proc.pid, signal.SIGKILL)
    proc.join(10)
    assert [j.folder for j in store.resumable()] == [job.folder]

    calls: list[str] = []
    actions = ActionLog()
    runner = JobRunner(store, [Step("dataset", lambda j: calls.append("dataset") or {}),
                               Step("train", lambda j: calls.append("train") or {})], actions)
    assert runner.submit(retrain_request("crashy")) is None  # still no second job
    resumed = runner.resume_all()
    assert [j.folder for j in resumed] == [job.folder]
    assert calls == ["train"]  # the finished step is not run again
    status = job.status()
    assert status["state"] == "accepted" and status["attempts"] == 2
    assert "retrain.resumed" in actions.names("crashy")


def test_failed_step_fails_the_job_with_its_reason(tmp_path: Path) -> None:
    def boom(job):
        raise ValueError("no bad cases in window")
    actions = ActionLog()
    runner = JobRunner(JobStore(tmp_path), [Step("dataset", boom)], actions)
    with pytest.raises(ValueError):
        runner.submit(retrain_request("k2"))
    job = JobStore(tmp_path).get("k2")
    assert job.state == "failed" and "no bad cases" in job.status()["error"]
    assert actions.records[-1].action == "dataset.failed" and actions.records[-1].outcome == "failed"


def test_step_can_end_job_as_rejected(tmp_path: Path) -> None:
    calls: list[str] = []
    steps = [Step("gate", lambda j: {"final_state": "rejected"}), Step("register", lambda j: calls.append("x") or {})]
    job = JobRunner(JobStore(tmp_path), steps, ActionLog()).submit(retrain_request("k3"))
    assert job.state == "rejected" and calls == []
