"""`entroloop bench ...`: run benchmarks and record their figures in BENCHMARKS.md."""

from __future__ import annotations

import functools
import json
import shutil
import tempfile
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from entroloop.benchmarks.report import (
    BenchmarksFileError,
    stored_figures,
    write_benchmarks,
)

bench_app = typer.Typer(help="Measure throughput, latency and detection quality; write BENCHMARKS.md.", no_args_is_help=True)
console = Console(stderr=True)

Out = Annotated[Path, typer.Option("--out", help="The Markdown report to update.")]
AsJson = Annotated[bool, typer.Option("--json", help="End with the results as one JSON line.")]


def checks_report_first(command):
    """``command`` that first checks its ``--out`` report can be merged into (a benchmark measures for
    minutes, then writes): a clear error and exit 2 instead of a traceback after the work."""

    @functools.wraps(command)
    def checked(*args, **kwargs):
        try:
            stored_figures(kwargs.get("out", Path("BENCHMARKS.md")))
            return command(*args, **kwargs)
        except BenchmarksFileError as exc:
            console.print(f"[red]bench {command.__name__.replace('_', '-')}: {exc}[/red]")
            raise typer.Exit(2) from None

    return checked


@bench_app.command("detectors")
@checks_report_first
def detectors(
    requests: Annotated[int, typer.Option(help="Synthetic requests to run through every processor.")] = 3000,
    out: Out = Path("BENCHMARKS.md"),
    as_json: AsJson = False,
    runs: Annotated[int, typer.Option(min=1, help="Timing runs of every processor (a fresh one each) and of the intent "
                                                  "scorers; speeds are their median, with the spread.")] = 3,
    intent_pairs: Annotated[Path | None, typer.Option(
        exists=True, dir_okay=False,
        help="Labelled query/answer pairs (the `entroloop eval intent` format) to measure the intent scorers' AUROC "
             "on; default: the hand-written set tests/data/intent/pairs.jsonl.")] = None,
) -> None:
    """Precision/recall of every detector against the fleet's labels, and events/s per processor; intent: the model
    alone and the two-stage cascade, pairs/s per stage, the share each decided, AUROC on the hand-written set."""
    from entroloop.benchmarks import detectors as bench

    with console.status("benchmarking detectors") as status:
        results = bench.run(requests, intent_runs=runs, runs=runs, intent_pairs=intent_pairs,
                            progress=lambda name: status.update(f"benchmarking {name}"))
    table = Table("detector", "precision", "recall", "events/s")
    for name, r in results.items():
        table.add_row(name, str(r["precision"]), str(r["recall"]), f"{r['events_per_s']:,}")
    console.print(table)
    write_benchmarks(bench.figures(results), out)
    console.print(f"updated {out}")
    if as_json:
        # precision, recall, events/s per detector; intent adds each stage's decided share and the
        # labelled set's AUROC / balanced accuracy where it measured them, the corrections their exact label set
        extra = ("decided_share", "labelled_set", "exact_set")
        print(json.dumps({k: {m: v[m] for m in ("precision", "recall", "events_per_s")} | {m: v[m] for m in extra if m in v}
                          for k, v in results.items()}))


@bench_app.command("all")
def run_all(
    out: Out = Path("BENCHMARKS.md"),
    as_json: Annotated[bool, typer.Option("--json", help='End with {"out", "measured", "not_measured"} as one JSON line.')] = False,
) -> None:
    """Run every benchmark and rewrite BENCHMARKS.md with this run's figures only.

    One benchmark that cannot run here (no broker, no ML environment) or fails does not stop the
    others: its section says why it has no figure. Figures of earlier runs are dropped, not kept:
    a reader of a file written by `bench all` can take every figure as measured in that run, on the
    machine it names (git keeps the earlier ones). The run writes into a scratch copy and replaces
    ``out`` (and its .json) only at the end, so an interrupted run leaves the old file whole.
    """
    failed: list[str] = []
    with tempfile.TemporaryDirectory(prefix="entroloop-bench-all-") as scratch:
        fresh = Path(scratch) / out.name
        for name, command in BENCHMARKS.items():
            console.rule(name)
            try:
                command(out=fresh)
            except (typer.Exit, SystemExit) as exc:
                code = getattr(exc, "exit_code", getattr(exc, "code", 0))
                if code:
                    failed.append(name)
                    _not_measured(name, f"`entroloop bench {name}` exited with {code} here (see its message)", fresh)
                    continue
            except Exception as exc:  # noqa: BLE001 - reported in the file and on stderr, the run goes on
                failed.append(name)
                console.print(f"[red]bench {name} failed: {type(exc).__name__}: {exc}[/red]")
                _not_measured(name, f"failed: {type(exc).__name__}: {str(exc)[:200]}", fresh)
                continue
            if not _wrote_section(name, fresh):
                failed.append(name)
                _not_measured(name, f"`entroloop bench {name}` ran but wrote no figures", fresh)
        out.parent.mkdir(parents=True, exist_ok=True)
        for source, target in ((fresh.with_suffix(".json"), out.with_suffix(".json")), (fresh, out)):
            shutil.copyfile(source, target)
    console.print(f"rewrote {out}")
    if failed:
        console.print(f"[yellow]not measured in this run: {', '.join(failed)}[/yellow]")
    if as_json:
        print(json.dumps({"out": str(out), "measured": [n for n in BENCHMARKS if n not in failed], "not_measured": failed}))


def _wrote_section(name: str, out: Path) -> bool:
    stored = stored_figures(out)
    return any(section.lower() == name.lower() for section in stored)


def _not_measured(name: str, reason: str, out: Path) -> None:
    """Say in the report why ``name`` has no figure in this run (no earlier figure is carried over)."""
    from entroloop.benchmarks.report import Figure

    write_benchmarks([Figure(name, "not measured in this run", None, "", note=reason)], out)


# name -> command; other modules add theirs through `add_benchmark`
BENCHMARKS: dict[str, object] = {"detectors": detectors}


def add_benchmark(name: str, command) -> None:
    bench_app.command(name)(checks_report_first(command))
    BENCHMARKS[name] = command


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
