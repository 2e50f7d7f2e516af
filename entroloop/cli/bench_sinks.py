"""``entroloop bench sinks``: rows/s into ClickHouse (chDB) per sink process, audit Parquet MB/s,
and the seconds it takes to verify 1M audited events.

Registered under the ``bench`` group when ``entroloop.cli.bench`` is there (its ``add_benchmark``),
otherwise as a top-level ``bench-sinks`` command.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

console = Console(stderr=True)

CLICKHOUSE_TARGET_ROWS_S = 200_000
VERIFY_TARGET_EVENTS_S = 100_000  # 1M events per 10 s


STAGE_LABELS = {
    "end_to_end": "decode + Arrow + insert",
    "end_to_end_per_cpu_s": "decode + Arrow + insert, per CPU-second of the process",
    "decode": "decode only, per CPU-second",
    "arrow": "Arrow build only, per CPU-second",
    "insert": "insert only (rollup views firing), per CPU-second",
}


def sinks(
    rows: Annotated[int, typer.Option(help="Rows per table inserted into chDB.")] = 300_000,
    batch_rows: Annotated[int, typer.Option(help="Rows per insert (the sink batch bound).")] = 50_000,
    audit_events: Annotated[int, typer.Option(help="Audit records written and then verified.")] = 1_000_000,
    baseline: Annotated[Path | None, typer.Option(
        help="JSON of an earlier run (--json) of another build, e.g. the previous commit measured just before "
             "on the same machine: the report gives each chDB figure as a ratio to it.")] = None,
    out: Annotated[Path, typer.Option("--out", help="BENCHMARKS.md to update (when the bench report module exists).")] = Path("BENCHMARKS.md"),
    as_json: Annotated[bool, typer.Option("--json", help="End with the figures as one JSON line.")] = False,
) -> None:
    """Measure the sinks: chDB rows/s (end to end and per stage), Parquet MB/s, verify events/s."""
    from entroloop.sinks import bench

    load_before = os.getloadavg()[0]
    with console.status("chDB inserts (decode + Arrow + insert)"):
        stages = bench.clickhouse_rows_per_s(rows, batch_rows)
    load = max(load_before, os.getloadavg()[0])  # other work on the machine slows every figure
    with console.status(f"writing {audit_events:,} audit records, then verifying") as status:
        audit = bench.audit_write_and_verify(
            audit_events, progress=lambda n: status.update(f"audit records written: {n:,}/{audit_events:,}")
        )
    previous = _baseline_rows_per_s(baseline) if baseline else {}
    table = Table("figure", "value", "target", "vs baseline")
    for name, by_stage in stages.items():
        for stage, value in by_stage.items():
            ratio = f"{value / previous[name][stage]:.2f}×" if stage in previous.get(name, {}) else ""
            target = f"≥ {CLICKHOUSE_TARGET_ROWS_S:,}" if stage == "end_to_end" else ""
            table.add_row(f"chDB rows, {name} ({STAGE_LABELS[stage]})", f"{value:,.0f}", target, ratio)
    table.add_row("load average (1 min) while inserting", f"{load:.2f}", "", "")
    table.add_row("audit Parquet written, MB/s", f"{audit['parquet_mb_per_s']:.1f}", "", "")
    table.add_row("audit records written/s", f"{audit['audit_records_per_s']:,.0f}", "", "")
    table.add_row(f"verify {audit_events:,} audited events, s", f"{audit['verify_seconds']:.2f}",
                  f"≤ {audit_events / VERIFY_TARGET_EVENTS_S:.0f}", "")
    table.add_row("verify, events/s", f"{audit['verify_events_per_s']:,.0f}", f"≥ {VERIFY_TARGET_EVENTS_S:,}", "")
    Console().print(table)
    figures = {
        "clickhouse_rows_per_s": {name: by_stage["end_to_end"] for name, by_stage in stages.items()},
        "clickhouse_rows_per_cpu_s": {name: by_stage["end_to_end_per_cpu_s"] for name, by_stage in stages.items()},
        "clickhouse_stage_rows_per_s": stages,
        "clickhouse_baseline_rows_per_s": previous,
        "load_average": load,
        "audit": audit,
    }
    _write_report(figures, out)
    if as_json:
        print(json.dumps(figures))


def _baseline_rows_per_s(path: Path) -> dict[str, dict[str, float]]:
    """Per table, the end-to-end chDB figures of an earlier ``--json`` run (its last JSON line):
    ``end_to_end`` rows/s, and ``end_to_end_per_cpu_s`` when that run measured CPU time too."""
    lines = [line for line in path.read_text().splitlines() if line.startswith("{")]
    if not lines:
        raise typer.BadParameter(f"{path} holds no JSON line of `entroloop bench sinks --json`")
    run = json.loads(lines[-1])
    out: dict[str, dict[str, float]] = {}
    for key, stage in (("clickhouse_rows_per_s", "end_to_end"), ("clickhouse_rows_per_cpu_s", "end_to_end_per_cpu_s")):
        for name, value in run.get(key, {}).items():
            out.setdefault(name, {})[stage] = float(value)
    return out


def _versus(value: float, previous: dict[str, float], stage: str, unit: str) -> str:
    """``value`` as a ratio to the baseline build's figure for ``stage``, or "" without one."""
    if stage not in previous:
        return ""
    return f"{value / previous[stage]:.2f}× the baseline build ({previous[stage]:,.0f} {unit}, same machine, measured just before)"


def _write_report(figures: dict, out: Path) -> None:
    """Merge the figures into BENCHMARKS.md through the bench report module, when it exists."""
    try:
        from entroloop.benchmarks.report import Figure, write_benchmarks
    except ImportError:
        return
    section = "Sinks"
    load = f"load average {figures['load_average']:.1f} on the machine while measuring"
    previous = figures["clickhouse_baseline_rows_per_s"]
    rows = []
    for name, by_stage in figures["clickhouse_stage_rows_per_s"].items():
        value, before = by_stage["end_to_end"], previous.get(name, {})
        rows.append(Figure(section, f"chDB rows/s per sink process, {name} (decode + Arrow + insert)", value, "rows/s",
                           target=f">= {CLICKHOUSE_TARGET_ROWS_S:,}", met=value >= CLICKHOUSE_TARGET_ROWS_S,
                           baseline=_versus(value, before, "end_to_end", "rows/s"), note=load,
                           load_average=round(figures["load_average"], 2)))
        per_cpu = by_stage["end_to_end_per_cpu_s"]
        rows.append(Figure(section, f"chDB rows per CPU-second, {name} (decode + Arrow + insert)", per_cpu, "rows/CPU-s",
                           baseline=_versus(per_cpu, before, "end_to_end_per_cpu_s", "rows/CPU-s"),
                           note="CPU time of every thread of the sink process: the figure others' load changes least"))
        rows += [Figure(section, f"chDB rows, {name}: {STAGE_LABELS[stage]}", by_stage[stage], "rows/CPU-s",
                        note="one stage alone: the slowest caps the sink")
                 for stage in ("decode", "arrow", "insert")]
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
