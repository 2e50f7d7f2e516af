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

from entroloop.benchmarks.repeats import DEFAULT_RUNS, Repeated

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
    runs: Annotated[int, typer.Option(min=1, help="Times each figure is measured; the report gives the median, "
                                                  "the spread and the load average.")] = DEFAULT_RUNS,
    baseline: Annotated[Path | None, typer.Option(
        help="JSON of an earlier run (--json) of another build, e.g. the previous commit measured just before "
             "on the same machine: the report gives each chDB figure as a ratio to it.")] = None,
    out: Annotated[Path, typer.Option("--out", help="BENCHMARKS.md to update (when the bench report module exists).")] = Path("BENCHMARKS.md"),
    as_json: Annotated[bool, typer.Option("--json", help="End with the figures (medians, and each run's values) as one JSON line.")] = False,
) -> None:
    """Measure the sinks: chDB rows/s (end to end and per stage), Parquet MB/s, verify events/s.

    Each figure is measured --runs times; the table, BENCHMARKS.md and --json give the median.
    """
    from entroloop.benchmarks import sinks as bench

    previous = _baseline_rows_per_s(baseline) if baseline else {}  # a bad file fails before minutes of work
    with console.status("chDB inserts") as status:
        stages = bench.clickhouse_repeated(rows, batch_rows, runs, progress=status.update)
    with console.status(f"writing {audit_events:,} audit records, then verifying") as status:
        audit = bench.audit_repeated(audit_events, runs, progress=status.update)
    load = max(m.load_average for by_stage in stages.values() for m in by_stage.values())
    table = Table("figure", "median", "runs (spread)", "target", "vs baseline")
    for name, by_stage in stages.items():
        for stage, measured in by_stage.items():
            ratio = f"{measured.median / previous[name][stage]:.2f}×" if stage in previous.get(name, {}) else ""
            target = f"≥ {CLICKHOUSE_TARGET_ROWS_S:,}" if stage == "end_to_end" else ""
            table.add_row(f"chDB rows, {name} ({STAGE_LABELS[stage]})", f"{measured.median:,.0f}",
                          _runs(measured), target, ratio)
    table.add_row("load average (1 min) while inserting, highest", f"{load:.2f}", "", "", "")
    table.add_row("audit Parquet written, MB/s", f"{audit['parquet_mb_per_s'].median:.1f}", _runs(audit["parquet_mb_per_s"]), "", "")
    table.add_row("audit records written/s", f"{audit['audit_records_per_s'].median:,.0f}",
                  _runs(audit["audit_records_per_s"]), "", "")
    table.add_row(f"verify {audit_events:,} audited events, s", f"{audit['verify_seconds'].median:.2f}",
                  _runs(audit["verify_seconds"]), f"≤ {audit_events / VERIFY_TARGET_EVENTS_S:.3g}", "")
    table.add_row("verify, events/s", f"{audit['verify_events_per_s'].median:,.0f}", _runs(audit["verify_events_per_s"]),
                  f"≥ {VERIFY_TARGET_EVENTS_S:,}", "")
    table.add_row(f"audit writer restart: chains opened, {audit['reopen_ids'].median:,.0f} recent ids read back, s",
                  f"{audit['reopen_seconds'].median:.2f}", _runs(audit["reopen_seconds"]), "", "")
    Console().print(table)
    _write_report(stages, audit, previous, out)
    if as_json:
        print(json.dumps({
            "runs": runs,
            "clickhouse_rows_per_s": {name: by_stage["end_to_end"].median for name, by_stage in stages.items()},
            "clickhouse_rows_per_cpu_s": {name: by_stage["end_to_end_per_cpu_s"].median for name, by_stage in stages.items()},
            "clickhouse_stage_rows_per_s": {name: {stage: m.median for stage, m in by_stage.items()}
                                            for name, by_stage in stages.items()},
            "clickhouse_stage_rows_per_s_runs": {name: {stage: list(m.values) for stage, m in by_stage.items()}
                                                 for name, by_stage in stages.items()},
            "clickhouse_baseline_rows_per_s": previous,
            "load_average": load,
            "audit": {key: m.median for key, m in audit.items()},
            "audit_runs": {key: list(m.values) for key, m in audit.items()},
        }))


def _runs(measured: Repeated) -> str:
    return f"{measured.runs} ({measured.spread()})" if measured.runs > 1 else "1"


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


def _write_report(stages: dict[str, dict[str, Repeated]], audit: dict[str, Repeated],
                  previous: dict[str, dict[str, float]], out: Path) -> None:
    """Merge the figures (medians of the runs) into BENCHMARKS.md through the bench report module, when it exists."""
    try:
        from entroloop.benchmarks.report import Figure, write_benchmarks
    except ImportError:
        return
    section = "Sinks"
    rows = []
    for name, by_stage in stages.items():
        value, before = by_stage["end_to_end"], previous.get(name, {})
        rows.append(Figure.repeated(section, f"chDB rows/s per sink process, {name} (decode + Arrow + insert)", value,
                                    "rows/s", target=f">= {CLICKHOUSE_TARGET_ROWS_S:,}",
                                    met=value.median >= CLICKHOUSE_TARGET_ROWS_S,
                                    baseline=_versus(value.median, before, "end_to_end", "rows/s")))
        per_cpu = by_stage["end_to_end_per_cpu_s"]
        rows.append(Figure.repeated(section, f"chDB rows per CPU-second, {name} (decode + Arrow + insert)", per_cpu,
                                    "rows/CPU-s", baseline=_versus(per_cpu.median, before, "end_to_end_per_cpu_s", "rows/CPU-s"),
                                    note="CPU time of every thread of the sink process: the figure others' load changes least"))
        rows += [Figure.repeated(section, f"chDB rows, {name}: {STAGE_LABELS[stage]}", by_stage[stage], "rows/CPU-s",
                                 note="one stage alone: the slowest caps the sink")
                 for stage in ("decode", "arrow", "insert")]
    events = int(audit["events"].median)
    rows += [
        Figure.repeated(section, "audit Parquet written (zstd)", audit["parquet_mb_per_s"], "MB/s"),
        Figure.repeated(section, f"verify {events:,} audited events", audit["verify_seconds"], "s",
                        target="<= 10 s per 1M", met=audit["verify_events_per_s"].median >= VERIFY_TARGET_EVENTS_S,
                        baseline="none verify data-plane audit"),
        Figure.repeated(section, "audit writer restart: open the 6 audit chains of that log", audit["reopen_seconds"], "s",
                        note=f"reads back the ids of each chain's newest batches ({audit['reopen_ids'].median:,.0f} ids), "
                             "so a copy arriving right after a restart is not a second row; local store"),
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
