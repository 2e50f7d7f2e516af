"""``entroloop bench sinks``: rows/s into ClickHouse (chDB) per sink process, audit Parquet MB/s,
and the seconds it takes to verify 1M audited events.

Registered under the ``bench`` group when ``entroloop.cli.bench`` is there (its ``add_benchmark``),
otherwise as a top-level ``bench-sinks`` command.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

console = Console(stderr=True)

CLICKHOUSE_TARGET_ROWS_S = 200_000
VERIFY_TARGET_EVENTS_S = 100_000  # 1M events per 10 s


def sinks(
    rows: Annotated[int, typer.Option(help="Rows per table inserted into chDB.")] = 300_000,
    batch_rows: Annotated[int, typer.Option(help="Rows per insert (the sink batch bound).")] = 50_000,
    audit_events: Annotated[int, typer.Option(help="Audit records written and then verified.")] = 1_000_000,
    out: Annotated[Path, typer.Option("--out", help="BENCHMARKS.md to update (when the bench report module exists).")] = Path("BENCHMARKS.md"),
    as_json: Annotated[bool, typer.Option("--json", help="End with the figures as one JSON line.")] = False,
) -> None:
    """Measure the sinks: chDB rows/s (decode + Arrow + insert), Parquet MB/s, verify events/s."""
    from sinks import bench

    with console.status("chDB inserts (decode + Arrow + insert)"):
        with_decode = bench.clickhouse_rows_per_s(rows, batch_rows, with_decode=True)
    with console.status("chDB inserts (Arrow + insert)"):
        insert_only = bench.clickhouse_rows_per_s(rows, batch_rows, with_decode=False)
    with console.status(f"writing {audit_events:,} audit records, then verifying") as status:
        audit = bench.audit_write_and_verify(
            audit_events, progress=lambda n: status.update(f"audit records written: {n:,}/{audit_events:,}")
        )
    table = Table("figure", "value", "target")
    for name, value in with_decode.items():
        table.add_row(f"chDB rows/s, {name} (decode+Arrow+insert)", f"{value:,.0f}", f"≥ {CLICKHOUSE_TARGET_ROWS_S:,}")
    for name, value in insert_only.items():
        table.add_row(f"chDB rows/s, {name} (Arrow+insert)", f"{value:,.0f}", f"≥ {CLICKHOUSE_TARGET_ROWS_S:,}")
    table.add_row("audit Parquet written, MB/s", f"{audit['parquet_mb_per_s']:.1f}", "")
    table.add_row("audit records written/s", f"{audit['audit_records_per_s']:,.0f}", "")
    table.add_row(f"verify {audit_events:,} audited events, s", f"{audit['verify_seconds']:.2f}",
                  f"≤ {audit_events / VERIFY_TARGET_EVENTS_S:.0f}")
    table.add_row("verify, events/s", f"{audit['verify_events_per_s']:,.0f}", f"≥ {VERIFY_TARGET_EVENTS_S:,}")
    Console().print(table)
    figures = {"clickhouse_rows_per_s": with_decode, "clickhouse_insert_only_rows_per_s": insert_only, "audit": audit}
    _write_report(figures, out)
    if as_json:
        print(json.dumps(figures))


def _write_report(figures: dict, out: Path) -> None:
    """Merge the figures into BENCHMARKS.md through the bench report module, when it exists."""
    try:
        from entroloop.benchmarks.report import Figure, write_benchmarks
    except ImportError:
        return
    section = "Sinks"
    rows = [
        Figure(section, f"chDB rows/s per sink process, {name} (decode + Arrow + insert)", value, "rows/s",
               target=f">= {CLICKHOUSE_TARGET_ROWS_S:,}", met=value >= CLICKHOUSE_TARGET_ROWS_S,
               baseline="row-by-row inserts")
        for name, value in figures["clickhouse_rows_per_s"].items()
    ]
    audit = figures["audit"]
    rows += [
        Figure(section, "audit Parquet written (zstd)", audit["parquet_mb_per_s"], "MB/s"),
        Figure(section, f"verify {int(audit['events']):,} audited events", audit["verify_seconds"], "s",
               target="<= 10 s per 1M", met=audit["verify_events_per_s"] >= VERIFY_TARGET_EVENTS_S,
               baseline="none verify data-plane audit"),
    ]
    write_benchmarks(rows, out)


def register(app: typer.Typer) -> None:
    try:
        from entroloop.cli import COMMAND_MODULES
        from entroloop.cli.bench import add_benchmark
    except ImportError:
        add_benchmark = None
        COMMAND_MODULES = []
    if add_benchmark is not None and "bench" in COMMAND_MODULES:
        add_benchmark("sinks", sinks)
    else:
        app.command("bench-sinks")(sinks)
