"""Sink benchmarks measured ``--runs`` times: the runs of :mod:`entroloop.sinks.bench`'s figures.

The single-run measurements live with the sink (they know its tables and stages); repeating them,
with the load and spread of each run, is the benchmarks layer's job (:mod:`.repeats`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from entroloop.benchmarks.repeats import Repeated, repeat_many
from entroloop.sinks.bench import (
    audit_write_and_verify,
    clickhouse_rows_per_s,
    own_chdb,
)


def clickhouse_repeated(rows: int, batch_rows: int, runs: int, progress: Callable[[str], None] = lambda text: None,
                        client: Any = None) -> dict[str, dict[str, Repeated]]:
    """:func:`clickhouse_rows_per_s` ``runs`` times: per table and stage, the runs' values and load.

    All runs share one chDB folder (``client``'s, or a scratch one: chDB opens one folder per
    process, so a fresh folder per run would need a process per run), each in a database of its own
    that is dropped after it: no run inserts next to, or waits on merges of, an earlier run's parts.
    """
    if client is None:
        with own_chdb() as own:
            return clickhouse_repeated(rows, batch_rows, runs, progress, own)
    numbers = iter(range(1, runs + 1))

    def once() -> dict[str, float]:
        n = next(numbers)
        progress(f"chDB inserts (decode + Arrow + insert), run {n}/{runs}")
        database = f"bench_run_{n}"
        try:
            by_table = clickhouse_rows_per_s(rows, batch_rows, client, database)
        finally:
            client.command(f"DROP DATABASE IF EXISTS {database} SYNC")
        return {f"{name}/{stage}": value for name, by_stage in by_table.items() for stage, value in by_stage.items()}

    flat = repeat_many(once, runs)
    out: dict[str, dict[str, Repeated]] = {}
    for key, measured in flat.items():
        name, stage = key.split("/")
        out.setdefault(name, {})[stage] = measured
    return out


def audit_repeated(events: int, runs: int, progress: Callable[[str], None] = lambda text: None) -> dict[str, Repeated]:
    """:func:`audit_write_and_verify` ``runs`` times, each into a fresh store."""
    numbers = iter(range(1, runs + 1))

    def once() -> dict[str, float]:
        n = next(numbers)
        return audit_write_and_verify(
            events, progress=lambda done: progress(f"audit run {n}/{runs}: records written {done:,}/{events:,}"))

    return repeat_many(once, runs)
