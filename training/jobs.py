"""Retraining jobs: one per trigger key, durable state in a folder per key, resumable after a crash.

Layout under ``root``::

    jobs/<key-folder>/request.json     the RetrainRequest that started the job (JSON)
    jobs/<key-folder>/status.json      state, steps done, results, attempts (replaced atomically)
    jobs/<key-folder>/lock             flock'ed by the process running the job
    jobs/<key-folder>/work/...         the steps' own files (data set, checkpoints, adapter)

Why this shape:
  * The job folder is created complete (request and status inside) in a temporary folder and
    renamed into place. ``rename`` of a folder onto an existing non-empty folder fails, so when two
    consumers see the same trigger, exactly one rename wins and the other starts no job; a crash
    can never leave a half-created job without its request.
  * The running process holds an ``flock`` on ``lock``: the kernel drops it when the process dies
    (even by SIGKILL), so "state not terminal and lock free" is exactly "crashed, resume me", with
    no stale-lease timeouts to tune.
  * Steps are named and recorded in ``status.json`` once done, so a resumed job skips them; a step
    that was interrupted runs again and must pick up its own partial work (the trainer resumes from
    its latest checkpoint).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import os
import re
import shutil
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import msgspec
from entroloop.training.actions import ActionLog

from entroloop.contract.records import RetrainRequest

TERMINAL_STATES = frozenset({"accepted", "rejected", "failed"})


class JobBusy(RuntimeError):
    """Another live process is running this job."""


def key_folder_name(trigger_key: str) -> str:
    """A filesystem-safe, unique folder name for a trigger key (readable prefix + hash)."""
    # Dots are dropped too, so no name can be "." or ".." or hide as a dot-file.
    readable = re.sub(r"[^A-Za-z0-9_-]+", "_", trigger_key)[:60].strip("_") or "key"
    return f"{readable}-{hashlib.sha256(trigger_key.encode()).hexdigest()[:16]}"


def _write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, sort_keys=True, default=str)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Job:
    """One job's folder: its request, its status, its work folder."""

    def __init__(self, folder: Path) -> None:
        self.folder = Path(folder)

    @property
    def work(self) -> Path:
        path = self.folder / "work"
        path.mkdir(exist_ok=True)
        return path

    @property
    def request(self) -> RetrainRequest:
        return msgspec.json.decode((self.folder / "request.json").read_bytes(), type=RetrainRequest)

    @property
    def trigger_key(self) -> str:
        return self.request.trigger_key

    def status(self) -> dict[str, Any]:
        return json.loads((self.folder / "status.json").read_text(encoding="utf-8"))

    @property
    def state(self) -> str:
        return str(self.status()["state"])

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    def update(self, **fields: Any) -> dict[str, Any]:
        """Merge ``fields`` into status.json (atomic replace) and return the new status."""
        status = self.status()
        status.update(fields)
        status["updated_at"] = time.time()
        _write_json_atomic(self.folder / "status.json", status)
        return status

    def step_done(self, name: str, result: dict[str, Any]) -> None:
        status = self.status()
        self.update(
            steps_done=[*status.get("steps_done", []), name],
            results={**status.get("results", {}), name: result},
        )

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold this job's lock for the block; ``JobBusy`` if a live process holds it."""
        fd = os.open(self.folder / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError as exc:
                raise JobBusy(f"job {self.folder.name} is running in another process") from exc
            os.ftruncate(fd, 0)
            os.write(fd, str(os.getpid()).encode())
            yield
        finally:
            os.close(fd)  # closing drops the flock

    def is_locked(self) -> bool:
        try:
            with self.locked():
                return False
        except JobBusy:
            return True


class JobStore:
    """The folder of all jobs; ``claim`` is the only way a job comes to exist."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self.jobs_dir = self.root / "jobs"
        self.jobs_dir.mkdir(parents=True, exist_ok=True)

    def folder_for(self, trigger_key: str) -> Path:
        return self.jobs_dir / key_folder_name(trigger_key)

    def get(self, trigger_key: str) -> Job | None:
        folder = self.folder_for(trigger_key)
        return Job(folder) if (folder / "status.json").exists() else None

    def claim(self, request: RetrainRequest) -> Job | None:
        """Create the job for ``request.trigger_key``; None if that key already has a job."""
        final = self.folder_for(request.trigger_key)
        if final.exists():
            return None
        tmp = self.jobs_dir / f".claim-{final.name}-{os.getpid()}-{time.monotonic_ns()}"
        tmp.mkdir()
        try:
            (tmp / "request.json").write_bytes(msgspec.json.encode(request))
            now = time.time()
            _write_json_atomic(
                tmp / "status.json",
                {
                    "trigger_key": request.trigger_key,
                    "state": "claimed",
                    "steps_done": [],
                    "results": {},
                    "attempts": 0,
                    "created_at": now,
                    "updated_at": now,
                },
            )
            try:
                os.rename(tmp, final)  # atomic; fails if another claim won
            except OSError as exc:
                if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                    return None
                raise
            _fsync_dir(self.jobs_dir)  # the rename itself is durable before anyone acts on the claim
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
        return Job(final)

    def jobs(self) -> list[Job]:
        return [
            Job(p)
            for p in sorted(self.jobs_dir.iterdir())
            if p.is_dir() and not p.name.startswith(".") and (p / "status.json").exists()
        ]

    def resumable(self) -> list[Job]:
        """Jobs that are not finished and that no live process is running (crashed ones), oldest claim first."""
        jobs = [job for job in self.jobs() if not job.terminal and not job.is_locked()]
        return sorted(jobs, key=lambda job: job.status().get("created_at", 0.0))


@dataclass(frozen=True)
class Step:
    """A named step of a job: ``run(job)`` returns a JSON-able result, recorded once done.

    A step may end the job early by returning ``{"final_state": "rejected", ...}``.
    """

    name: str
    run: Callable[[Job], dict[str, Any]]


class JobRunner:
    """Runs the steps of jobs, once per trigger key, resuming crashed jobs where they stopped."""

    def __init__(self, store: JobStore, steps: Sequence[Step], actions: ActionLog) -> None:
        self.store = store
        self.steps = list(steps)
        self.actions = actions

    def submit(self, request: RetrainRequest) -> Job | None:
        """Claim and run the job for ``request``; None (and an action) if the key already has one."""
        job = self.claim(request)
        if job is not None:
            self.run(job)
        return job

    def claim(self, request: RetrainRequest) -> Job | None:
        """Claim the job for ``request`` (durable when this returns) and record it, without running it.

        None (and a ``retrain.duplicate`` action) if the key already has a job. A claimed job that is
        never run (its process died) is found by ``resume_all``: state not terminal, lock free.
        """
        job = self.store.claim(request)
        if job is None:
            existing = self.store.get(request.trigger_key)
            self.actions.record(
                "retrain.duplicate",
                request.trigger_key,
                outcome="skipped",
                trace_id=request.trace_id,
                event_id=request.event_id,
                existing_state=existing.state if existing else "claiming",
            )
            return None
        self.actions.record(
            "retrain.claimed", request.trigger_key, trace_id=request.trace_id, event_id=request.event_id,
            model=request.model, reason=request.reason, bad_case_count=request.bad_case_count,
        )
        return job

    def resume_all(self) -> list[Job]:
        """Run every crashed, unfinished job to its end."""
        resumed = []
        for job in self.store.resumable():
            try:
                self.run(job)
            except JobBusy:
                continue  # another consumer picked it up between the check and the lock
            resumed.append(job)
        return resumed

    def run(self, job: Job) -> dict[str, Any]:
        """Run ``job``'s remaining steps under its lock; return the final status."""
        with job.locked():
            status = job.status()
            if status["state"] in TERMINAL_STATES:
                return status
            key = status["trigger_key"]
            trace_id = job.request.trace_id
            attempts = int(status.get("attempts", 0)) + 1
            if attempts > 1:
                self.actions.record(
                    "retrain.resumed", key, trace_id=trace_id, attempt=attempts,
                    steps_done=status.get("steps_done", []),
                )
            job.update(attempts=attempts)
            for step in self.steps:
                if step.name in job.status().get("steps_done", []):
                    continue
                job.update(state=step.name)
                started = time.monotonic()
                try:
                    result = step.run(job)
                except Exception as exc:  # a failed step fails the job, visibly, with its reason
                    job.update(state="failed", error=f"{type(exc).__name__}: {exc}",
                               traceback=traceback.format_exc())
                    self.actions.record(f"{step.name}.failed", key, outcome="failed", trace_id=trace_id,
                                        error=f"{type(exc).__name__}: {exc}")
                    raise
                result = {**result, "seconds": round(time.monotonic() - started, 3)}
                job.step_done(step.name, result)
                final_state = result.get("final_state")
                self.actions.record(
                    f"{step.name}.completed", key, outcome=str(final_state or "ok"), trace_id=trace_id,
                    **{k: v for k, v in result.items() if k != "final_state"},
                )
                if final_state:
                    return job.update(state=final_state)
            return job.update(state="accepted")


__all__ = ["Job", "JobBusy", "JobRunner", "JobStore", "Step", "TERMINAL_STATES", "key_folder_name"]
