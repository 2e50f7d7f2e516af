"""What the action runner remembers across restarts: one execution per (runbook, alert key, mode), and
the execution times its rate limits count. A small SQLite file (or ``:memory:`` in tests).

An execution is *claimed* before its first step runs and *finished* with its outcome afterwards.
A claim that was never finished (the process died mid-run) may be claimed again: steps are then
re-sent with the same ``Idempotency-Key``, so a receiver that already applied them ignores them.
A finished execution is never run again, whatever its outcome.

The *outbox* (optional, used by ``entroloop actions``) keeps the encoded records an execution produced,
written in the same transaction that finishes it, until the caller says they were delivered: a
process that dies after finishing but before its Action records reached Kafka re-sends them on its
next start instead of losing them (the redelivered alert itself is a duplicate by then).
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from entroloop.infra.private_files import make_private_dir, open_private

_SCHEMA = """
CREATE TABLE IF NOT EXISTS executions (
    runbook TEXT NOT NULL,
    alert_key TEXT NOT NULL,
    mode TEXT NOT NULL,
    runbook_version TEXT NOT NULL,
    status TEXT NOT NULL,           -- claimed | finished
    outcome TEXT NOT NULL DEFAULT '',
    claimed_at REAL NOT NULL,
    finished_at REAL,
    PRIMARY KEY (runbook, alert_key, mode)
);
CREATE TABLE IF NOT EXISTS rate_events (runbook TEXT NOT NULL, mode TEXT NOT NULL, at REAL NOT NULL);
CREATE INDEX IF NOT EXISTS rate_events_by_runbook ON rate_events (runbook, mode, at);
CREATE TABLE IF NOT EXISTS outbox (id INTEGER PRIMARY KEY AUTOINCREMENT, value BLOB NOT NULL);
"""


class ActionState:
    """Durable idempotency and rate-limit memory of the action runner."""

    def __init__(self, path: Path | str = ":memory:") -> None:
        if str(path) != ":memory:":
            make_private_dir(Path(path).parent)
            open_private(Path(path), "ab").close()  # 0600 before sqlite opens it (its WAL copies the mode)
        self.path = str(path)
        self._lock = threading.Lock()
        # isolation_level=None: autocommit; each method is its own explicit transaction.
        self._db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(_SCHEMA)

    def claim(self, runbook: str, alert_key: str, mode: str, version: str, now: float | None = None) -> bool:
        """True if this execution should run now (never seen, or claimed but never finished)."""
        now = time.time() if now is None else now
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                row = self._db.execute(
                    "SELECT status FROM executions WHERE runbook = ? AND alert_key = ? AND mode = ?",
                    (runbook, alert_key, mode),
                ).fetchone()
                if row is not None and row[0] == "finished":
                    self._db.execute("COMMIT")
                    return False
                self._db.execute(
                    "INSERT OR REPLACE INTO executions (runbook, alert_key, mode, runbook_version, status, claimed_at) "
                    "VALUES (?, ?, ?, ?, 'claimed', ?)",
                    (runbook, alert_key, mode, version, now),
                )
                self._db.execute("COMMIT")
                return True
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def finish(self, runbook: str, alert_key: str, mode: str, outcome: str, now: float | None = None,
               outbox: Sequence[bytes] = ()) -> None:
        """Mark the execution finished and, atomically with it, queue ``outbox`` (its encoded records)."""
        now = time.time() if now is None else now
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute(
                    "UPDATE executions SET status = 'finished', outcome = ?, finished_at = ? "
                    "WHERE runbook = ? AND alert_key = ? AND mode = ?",
                    (outcome, now, runbook, alert_key, mode),
                )
                self._db.executemany("INSERT INTO outbox (value) VALUES (?)", [(value,) for value in outbox])
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def outbox(self) -> list[tuple[int, bytes]]:
        """Queued records not yet delivered, oldest first: (id, encoded record)."""
        with self._lock:
            return [(row[0], bytes(row[1])) for row in self._db.execute("SELECT id, value FROM outbox ORDER BY id")]

    def delivered(self, ids: Iterable[int]) -> None:
        """Forget outbox entries that reached their topic."""
        with self._lock:
            self._db.executemany("DELETE FROM outbox WHERE id = ?", [(i,) for i in ids])

    def outcome(self, runbook: str, alert_key: str, mode: str) -> str | None:
        """The finished outcome, '' while only claimed, None if never seen."""
        with self._lock:
            row = self._db.execute(
                "SELECT status, outcome FROM executions WHERE runbook = ? AND alert_key = ? AND mode = ?",
                (runbook, alert_key, mode),
            ).fetchone()
        if row is None:
            return None
        return row[1] if row[0] == "finished" else ""

    def take_rate_slot(self, runbook: str, mode: str, limit: int, per_s: float, now: float | None = None) -> bool:
        """Record an execution if fewer than ``limit`` happened in the last ``per_s`` seconds."""
        now = time.time() if now is None else now
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.execute("DELETE FROM rate_events WHERE runbook = ? AND mode = ? AND at <= ?", (runbook, mode, now - per_s))
                (used,) = self._db.execute(
                    "SELECT count() FROM rate_events WHERE runbook = ? AND mode = ?", (runbook, mode)
                ).fetchone()
                allowed = used < limit
                if allowed:
                    self._db.execute("INSERT INTO rate_events (runbook, mode, at) VALUES (?, ?, ?)", (runbook, mode, now))
                self._db.execute("COMMIT")
                return allowed
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def close(self) -> None:
        with self._lock:
            self._db.close()


__all__ = ["ActionState"]
