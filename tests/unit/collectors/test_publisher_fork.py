"""The publisher in a forked child: its own producer, thread and spool, and nothing that can hang it.

A child is forked from a process whose librdkafka threads go on in the parent only. Two things of the
parent's can still reach the child. Its producer handles: destroying one in the child (its garbage
collector would) joins threads that do not exist there. And C locks held by a parent thread at the
fork: glibc's getaddrinfo(AI_ADDRCONFIG), which every librdkafka broker thread calls to resolve its
broker, takes a process-wide lock (check_pf.c); a child forked while a parent thread holds it can never
resolve an address. Its publisher never reaches Kafka, so it must spool every record and close on
time. Before the fix it froze: confluent-kafka's purge waits when given ``blocking=False`` (the flag
is read backwards) and holds the GIL while it waits for a broker thread that never answers.
CI hung on this (test_publisher_offline.py, 2026-12-01).

The parent of every fork here waits with a deadline, so a hang fails the test instead of the run.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from entroloop.collectors.publisher import Publisher

from entroloop.contract import codec
from tests.unit.collectors.test_publisher_offline import (
    feedback_records,
    offline_config,
    spooled_values,
    wait_for,
)

ROOT = Path(__file__).resolve().parents[3]
CHILD_DEADLINE_S = 60.0
PRECONDITION_NOT_MET = 5


def wait_for_child(pid: int, timeout: float = CHILD_DEADLINE_S) -> int | None:
    """The child's exit code, or None after killing it when it has not exited within ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return None


def test_forked_child_gets_its_own_thread_producer_and_spool(tmp_path: Path) -> None:
    publisher = Publisher(offline_config(tmp_path))
    parent_spool = publisher._spool.path
    pid = os.fork()
    if pid == 0:  # child: must never return into pytest
        code = 1
        try:
            ok = publisher._thread.is_alive() and publisher._spool.path != parent_spool
            for record in feedback_records(10, node="child"):
                publisher.publish(record)
            ok = ok and wait_for(lambda: publisher.stats()["spooled"] == 10, timeout=10)
            publisher.close(timeout=0.2)
            code = 0 if ok else 2
        finally:
            os._exit(code)
    code = wait_for_child(pid)
    assert code == 0, "the child hung" if code is None else f"the child exited with {code}"
    # The parent is unaffected and still works.
    publisher.publish(feedback_records(1, node="parent")[0])
    assert wait_for(lambda: publisher.stats()["spooled"] == 1), publisher.stats()
    publisher.close(timeout=0.2)
    nodes = {codec.decode(v).node_id for v in spooled_values(tmp_path)}
    assert nodes == {"child", "parent"}


def _resolve_loopback() -> None:
    # librdkafka's broker threads resolve with these flags (rdkafka_broker.c: AI_ADDRCONFIG).
    socket.getaddrinfo("127.0.0.1", 9092, 0, socket.SOCK_STREAM, socket.IPPROTO_TCP, socket.AI_ADDRCONFIG)


def _resolver_is_stuck() -> bool:
    probe = threading.Thread(target=_resolve_loopback, daemon=True)
    probe.start()
    probe.join(1.0)
    return probe.is_alive()


class _Said(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def fork_with_the_resolver_lock_held(spool_dir: str, result_file: str, attempts: int = 60) -> None:
    """Run in a fresh interpreter (no pytest threads): fork until a child inherits glibc's resolver
    lock held; there a publisher must spool 10 records and close. Exits with the child's code."""

    def spin() -> None:
        while True:
            _resolve_loopback()

    for _ in range(4):
        threading.Thread(target=spin, daemon=True).start()
    for _ in range(attempts):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                code = _publish_in_a_child_that_cannot_resolve(Path(spool_dir), Path(result_file))
            finally:
                os._exit(code)
        code = wait_for_child(pid)
        if code != 3:
            sys.exit(4 if code is None else code)
    sys.exit(PRECONDITION_NOT_MET)


def _publish_in_a_child_that_cannot_resolve(spool_dir: Path, result_file: Path) -> int:
    """0 when the publisher spooled and closed; 3 when this fork missed the lock (try another)."""
    if not _resolver_is_stuck():
        return 3
    said = _Said()
    logging.getLogger("entroloop.collectors.publisher").addHandler(said)
    publisher = Publisher(offline_config(spool_dir))
    for record in feedback_records(10, node="child"):
        publisher.publish(record)
    spooled = wait_for(lambda: publisher.stats()["spooled"] == 10, timeout=20)
    started = time.monotonic()
    stats = publisher.close(timeout=0.5)
    if any("all brokers down" in line for line in said.lines):
        # librdkafka resolved the broker's address after all (and was refused): not the scenario.
        shutil.rmtree(spool_dir)
        return 3
    result_file.write_text(json.dumps({"spooled_in_time": spooled, "close_s": time.monotonic() - started,
                                       "stats": stats}))
    return 0


def test_a_child_forked_while_a_broker_address_resolves_spools_everything_and_closes(tmp_path: Path) -> None:
    spool_dir, result_file = tmp_path / "spool", tmp_path / "result.json"
    script = ("from tests.unit.collectors.test_publisher_fork import fork_with_the_resolver_lock_held as run; "
              f"run({str(spool_dir)!r}, {str(result_file)!r})")
    done = subprocess.run([sys.executable, "-c", script], check=False, cwd=ROOT, capture_output=True, text=True,
                          timeout=5 * CHILD_DEADLINE_S)
    explain = {4: "the child's publisher hung (killed after the deadline)",
               PRECONDITION_NOT_MET: "no fork inherited the resolver lock held; the scenario did not happen"}
    assert done.returncode == 0, f"{explain.get(done.returncode, done.returncode)}\n{done.stderr[-3000:]}"
    result = json.loads(result_file.read_text())
    assert result["spooled_in_time"], result
    assert result["close_s"] < 10, result
    assert result["stats"]["dropped"] == 0, result
    assert [codec.decode(v).request_id for v in spooled_values(spool_dir)] == [f"req-{i}" for i in range(10)]
