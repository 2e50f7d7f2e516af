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

Each transaction is a durable commit (an fsync of the WAL), the cost that bounds a runner handling
alerts one by one: ``decide`` (claims and rate slots) and ``finish_many`` take a whole batch of
executions in one transaction each, and ``delivered`` forgets a batch of outbox entries in one.
"""

from __future__ import annotations

import sqlite3
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
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


RUN, DUPLICATE, RATE_LIMITED = "run", "duplicate", "rate_limited"


@dataclass(frozen=True)
class Claim:
    """One execution a batch asks to run: ``limit`` is (max, per_s) of its runbook's rate limit, if any."""

    runbook: str
    alert_key: str
    mode: str
    version: str
    limit: tuple[int, float] | None = None


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
        return self.decide([Claim(runbook, alert_key, mode, version)], now) == [RUN]

    def decide(self, claims: Sequence[Claim], now: float | None = None) -> list[str]:
        """For each claim, in order and in one transaction: ``DUPLICATE`` (finished before, or asked
        twice in this batch), ``RATE_LIMITED`` (claimed, but its runbook's rate limit is used up:
        the caller finishes it as such) or ``RUN`` (claimed and a rate slot taken)."""
        now = time.time() if now is None else now
        decisions: list[str] = []
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                seen: set[tuple[str, str, str]] = set()
                pruned: set[tuple[str, str]] = set()
                for claim in claims:
                    key = (claim.runbook, claim.alert_key, claim.mode)
                    if key in seen or not self._claim(claim, now):
                        decisions.append(DUPLICATE)
                        seen.add(key)
                        continue
                    seen.add(key)
                    if claim.limit is None:
                        decisions.append(RUN)
                        continue
                    if (claim.runbook, claim.mode) not in pruned:
                        pruned.add((claim.runbook, claim.mode))
                        self._db.execute("DELETE FROM rate_events WHERE runbook = ? AND mode = ? AND at <= ?",
                                         (claim.runbook, claim.mode, now - claim.limit[1]))
                    allowed = self._rate_slot(claim.runbook, claim.mode, claim.limit[0], claim.limit[1], now)
                    decisions.append(RUN if allowed else RATE_LIMITED)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return decisions

    def _claim(self, claim: Claim, now: float) -> bool:
        row = self._db.execute(
            "SELECT status FROM executions WHERE runbook = ? AND alert_key = ? AND mode = ?",
            (claim.runbook, claim.alert_key, claim.mode),
        ).fetchone()
        if row is not None and row[0] == "finished":
            return False
        self._db.execute(
            "INSERT OR REPLACE INTO executions (runbook, alert_key, mode, runbook_version, status, claimed_at) "
            "VALUES (?, ?, ?, ?, 'claimed', ?)",
            (claim.runbook, claim.alert_key, claim.mode, claim.version, now),
        )
        return True

    def _rate_slot(self, runbook: str, mode: str, limit: int, per_s: float, now: float) -> bool:
        (used,) = self._db.execute(
            "SELECT count() FROM rate_events WHERE runbook = ? AND mode = ? AND at > ?", (runbook, mode, now - per_s)
        ).fetchone()
        if used >= limit:
            return False
        self._db.execute("INSERT INTO rate_events (runbook, mode, at) VALUES (?, ?, ?)", (runbook, mode, now))
        return True

    def finish_many(self, finished: Sequence[tuple[str, str, str, str]], outbox: Sequence[bytes] = (),
                    now: float | None = None) -> None:
        """Mark executions (runbook, alert key, mode, outcome) finished and queue ``outbox``, in one transaction."""
        now = time.time() if now is None else now
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany(
                    "UPDATE executions SET status = 'finished', outcome = ?, finished_at = ? "
                    "WHERE runbook = ? AND alert_key = ? AND mode = ?",
                    [(outcome, now, runbook, key, mode) for runbook, key, mode, outcome in finished],
                )
                self._db.executemany("INSERT INTO outbox (value) VALUES (?)", [(value,) for value in outbox])
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def finish(self, runbook: str, alert_key: str, mode: str, outcome: str, now: float | None = None,
               outbox: Sequence[bytes] = ()) -> None:
        """Mark the execution finished and, atomically with it, queue ``outbox`` (its encoded records)."""
        self.finish_many([(runbook, alert_key, mode, outcome)], outbox, now)

    def outbox(self) -> list[tuple[int, bytes]]:
        """Queued records not yet delivered, oldest first: (id, encoded record)."""
        with self._lock:
            return [(row[0], bytes(row[1])) for row in self._db.execute("SELECT id, value FROM outbox ORDER BY id")]

    def delivered(self, ids: Iterable[int]) -> None:
        """Forget outbox entries that reached their topic (one transaction: one commit, not one per entry)."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._db.executemany("DELETE FROM outbox WHERE id = ?", [(i,) for i in ids])
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

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

    def close(self) -> None:
        with self._lock:
            self._db.close()


__all__ = ["DUPLICATE", "RATE_LIMITED", "RUN", "ActionState", "Claim"]
