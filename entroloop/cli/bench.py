"""`entroloop bench ...`: run benchmarks and record their figures in BENCHMARKS.md."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from entroloop.benchmarks.report import write_benchmarks

bench_app = typer.Typer(help="Measure throughput, latency and detection quality; write BENCHMARKS.md.", no_args_is_help=True)
console = Console(stderr=True)

Out = Annotated[Path, typer.Option("--out", help="The Markdown report to update.")]
AsJson = Annotated[bool, typer.Option("--json", help="End with the results as one JSON line.")]


@bench_app.command()
def detectors(
    requests: Annotated[int, typer.Option(help="Synthetic requests to run through every processor.")] = 3000,
    out: Out = Path("BENCHMARKS.md"),
    as_json: AsJson = False,
) -> None:
    """Precision/recall of every detector against the fleet's labels, and events/s per processor."""
    from entroloop.benchmarks import detectors as bench

    with console.status("benchmarking detectors") as status:
        results = bench.run(requests, progress=lambda name: status.update(f"benchmarking {name}"))
    table = Table("detector", "precision", "recall", "events/s")
    for name, r in results.items():
        table.add_row(name, str(r["precision"]), str(r["recall"]), f"{r['events_per_s']:,}")
    console.print(table)
    write_benchmarks(bench.figures(results), out)
    console.print(f"updated {out}")
    if as_json:
        print(json.dumps({k: {m: v[m] for m in ("precision", "recall", "events_per_s")} for k, v in results.items()}))


@bench_app.command("all")
def run_all(out: Out = Path("BENCHMARKS.md")) -> None:
    """Run every benchmark and rewrite BENCHMARKS.md.

    One benchmark that cannot run here (no broker, no ML environment) or fails does not stop the
    others: its section says why it has no figure (figures of an earlier run are kept, marked so).
    """
    failed: list[str] = []
    for name, command in BENCHMARKS.items():
        console.rule(name)
        try:
            command(out=out)
        except (typer.Exit, SystemExit) as exc:
            code = getattr(exc, "exit_code", getattr(exc, "code", 0))
            if code:
                failed.append(name)
                _not_measured(name, f"`entroloop bench {name}` exited with {code} here (see its message)", out)
        except Exception as exc:  # noqa: BLE001 - reported in the file and on stderr, the run goes on
            failed.append(name)
            console.print(f"[red]bench {name} failed: {type(exc).__name__}: {exc}[/red]")
            _not_measured(name, f"failed: {type(exc).__name__}: {str(exc)[:200]}", out)
    if failed:
        console.print(f"[yellow]not measured in this run: {', '.join(failed)}[/yellow]")


def _not_measured(name: str, reason: str, out: Path) -> None:
    """Say in BENCHMARKS.md why ``name`` has no new figure; keep an earlier run's figures, marked."""
    from dataclasses import replace

    from entroloop.benchmarks.report import Figure

    data_path = out.with_suffix(".json")
    stored = json.loads(data_path.read_text()).get(name, []) if data_path.exists() else []
    earlier = [Figure(**d) for d in stored if d.get("value") is not None]
    if earlier:
        note = f"from an earlier run; not re-measured by `bench all`: {reason}"
        first_note = earlier[0].note.split("from an earlier run")[0].rstrip("; ")
        figures = [replace(earlier[0], note="; ".join(x for x in (first_note, note) if x)), *earlier[1:]]
    else:
        figures = [Figure(name, "not measured", None, "", note=reason)]
    write_benchmarks(figures, out)


# name -> command; other modules add theirs through `add_benchmark`
BENCHMARKS: dict[str, object] = {"detectors": detectors}


def add_benchmark(name: str, command) -> None:
    bench_app.command(name)(command)
    BENCHMARKS[name] = command


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app, name="bench")
