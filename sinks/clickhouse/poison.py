"""Find the record(s) that make a batch insert fail, store the rest, and report the culprits.

One row ClickHouse refuses (a value its column cannot hold) fails the whole insert, and a sink
that simply retries the batch fails the same way forever: the pipeline stops at that record and
nothing behind it is stored. The contract's decode-time validation keeps such records out, but a
sink cannot assume every producer ran this build's validation, nor that every column constraint
can be said in the contract. So a failed insert is bisected: each half is inserted on its own,
halves that fail are split again, and a single record that still fails is *poison*: the caller
turns it into a dead letter with ClickHouse's error text as the reason and goes on.

Not every failure is about the rows. ClickHouse being down, out of disk or memory, read-only, or a
missing table would make every record look like poison; those errors (connection errors and the
server codes in ``SYSTEMIC_ERROR_CODES``) are raised unchanged, so the batch is retried with
backoff and nothing is dead-lettered. As a second guard, a batch of more than one record in which
*no* record could be inserted, or in which more than ``max_poison`` records fail, is also treated
as a systemic failure and raised.

Idempotency survives the split: each half's insert deduplication token is derived from its parent's
(``T`` -> ``T/0``, ``T/1``), and a redelivered batch (same records, same token) fails and splits
the same way, so every good half repeats its token and ClickHouse drops the repeat.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

T = TypeVar("T")

# ClickHouse error codes that say "the server cannot take writes now", not "this row is wrong".
SYSTEMIC_ERROR_CODES = frozenset({
    3,  # UNEXPECTED_END_OF_FILE (a connection cut mid-insert)
    60,  # UNKNOWN_TABLE
    81,  # UNKNOWN_DATABASE
    159,  # TIMEOUT_EXCEEDED
    164,  # READONLY
    173,  # CANNOT_ALLOCATE_MEMORY
    201,  # QUOTA_EXCEEDED
    202,  # TOO_MANY_SIMULTANEOUS_QUERIES
    209,  # SOCKET_TIMEOUT
    210,  # NETWORK_ERROR
    236,  # ABORTED
    241,  # MEMORY_LIMIT_EXCEEDED
    242,  # TABLE_IS_READ_ONLY
    243,  # NOT_ENOUGH_SPACE
    252,  # TOO_MANY_PARTS
    394,  # QUERY_WAS_CANCELLED
    425,  # SYSTEM_ERROR
    497,  # ACCESS_DENIED
    516,  # AUTHENTICATION_FAILED
})
_CODE = re.compile(r"Code: (\d+)\.")
DEFAULT_MAX_POISON = 16
MAX_REASON_CHARS = 1000


class SystemicInsertError(RuntimeError):
    """The insert fails for reasons that are not any one record's: retry the batch later."""


class PoisonRecordsError(RuntimeError):
    """Records of a batch that ClickHouse refused on their own (the rest of the batch is stored).

    Raised only when the caller gave no handler for them; ``records`` holds ``(index, record,
    reason)``.
    """

    def __init__(self, table: str, records: list[tuple[int, object, str]]) -> None:
        self.table = table
        self.records = records
        super().__init__(f"{len(records)} record(s) refused by {table}: {records[0][2]}")


def is_systemic(error: BaseException) -> bool:
    """True when ``error`` says the server (or the way to it) is unwell, not that a row is wrong."""
    from clickhouse_connect.driver.exceptions import OperationalError

    if isinstance(error, (OperationalError, OSError, MemoryError, SystemicInsertError)):
        return True  # OSError covers ConnectionError and TimeoutError
    match = _CODE.search(str(error))
    return bool(match) and int(match[1]) in SYSTEMIC_ERROR_CODES


def error_text(error: BaseException) -> str:
    """The error as a dead letter's reason: ClickHouse's own message, one line, bounded."""
    text = " ".join(str(error).split()) or type(error).__name__
    return f"{type(error).__name__}: {text}"[:MAX_REASON_CHARS]


@dataclass(frozen=True)
class Poison(Generic[T]):
    """A record no insert could take: its position in the batch, the record, and why."""

    index: int
    item: T
    reason: str


def insert_isolating_poison(
    items: Sequence[T],
    token: str,
    insert: Callable[[Sequence[T], str], None],
    max_poison: int = DEFAULT_MAX_POISON,
) -> list[Poison[T]]:
    """Insert ``items`` with ``insert(items, token)``; on failure bisect and return the poison.

    Every item not returned was inserted (by one of the calls). Raises the error unchanged when
    it is systemic, and ``SystemicInsertError`` when nothing of a batch of two or more could be
    inserted or more than ``max_poison`` items fail on their own.
    """
    poison: list[Poison[T]] = []
    inserted = 0

    def attempt(lo: int, hi: int, tok: str, error: BaseException | None) -> None:
        nonlocal inserted
        if error is None:
            try:
                insert(items[lo:hi], tok)
                inserted += hi - lo
                return
            except Exception as exc:
                if is_systemic(exc):
                    raise
                error = exc
        if hi - lo == 1:
            poison.append(Poison(lo, items[lo], error_text(error)))
            if len(poison) > max_poison:
                raise SystemicInsertError(
                    f"more than {max_poison} records of one batch fail to insert on their own; treated as a "
                    f"ClickHouse-side failure and retried (last error: {error_text(error)})"
                ) from error
            return
        mid = (lo + hi) // 2
        attempt(lo, mid, f"{tok}/0", None)
        attempt(mid, hi, f"{tok}/1", None)

    try:
        insert(items, token)
        return []
    except Exception as first:
        if is_systemic(first) or not items:
            raise
        attempt(0, len(items), token, first)
        if not inserted and len(items) > 1:
            raise SystemicInsertError(
                f"none of {len(items)} records could be inserted; treated as a ClickHouse-side failure and "
                f"retried ({error_text(first)})"
            ) from first
        return poison


__all__ = [
    "DEFAULT_MAX_POISON",
    "SYSTEMIC_ERROR_CODES",
    "Poison",
    "PoisonRecordsError",
    "SystemicInsertError",
    "error_text",
    "insert_isolating_poison",
    "is_systemic",
]
