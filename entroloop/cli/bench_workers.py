"""``entroloop bench workers``: the Faust worker against a plain confluent-kafka loop running the
same processors on the same fleet events, side by side in one run (entroloop/benchmarks/workers.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

console = Console(stderr=True)


def workers(
    requests: Annotated[int, typer.Option(min=100, help="Fleet requests whose events both workers drain (100,000: ~218k events; on a fast host 40,000 left the plain loop ~1 s of measured draining, too short to be steady).")] = 100_000,
    runs: Annotated[int, typer.Option(min=1, help="Runs of both variants; figures are the median, with the spread.")] = 3,
    broker: Annotated[str | None, typer.Option("--broker", "-b", help="Kafka bootstrap HOST:PORT (default ENTROLOOP_KAFKA_BOOTSTRAP).")] = None,
    partitions: Annotated[int, typer.Option(min=1, help="Partitions per topic.")] = 6,
    out: Annotated[Path, typer.Option("--out", help="The Markdown report to update.")] = Path("BENCHMARKS.md"),
    as_json: Annotated[bool, typer.Option("--json", help="End with the results as one JSON line.")] = False,
) -> None:
    """Events/s and CPU per event of `entroloop worker` (Faust) and of a plain consumer loop, same processors."""
    from entroloop.benchmarks import workers as bench
    from entroloop.benchmarks.lag import broker_problem
    from entroloop.benchmarks.report import write_benchmarks
    from entroloop.cli.distributed import broker_address
    from entroloop.contract.settings import load_settings

    bootstrap = broker_address(broker) if broker else load_settings().kafka_bootstrap
    problem = broker_problem(bootstrap)
    if problem:
        # `entroloop bench all` goes on without a broker: the report says why there is no figure.
        console.print(f"[yellow]bench workers: not measured: {problem}. Start one with `make services-up` "
                      "(or `bash scripts/services.sh up kafka`) and set ENTROLOOP_KAFKA_BOOTSTRAP.[/yellow]")
        write_benchmarks(bench.not_measured(problem), out)
        return
    with console.status("workers benchmark") as status:
        result = bench.run(bootstrap, requests=requests, runs=runs, partitions=partitions,
                           progress=lambda text: status.update(f"bench workers: {text}"))
    repeated = result["repeated"]
    table = Table("figure", "median", "spread", "load")
    for key, measured in repeated.items():
        table.add_row(key, f"{measured.median:,.3f}", measured.spread(), f"{measured.load_average:.2f}")
    Console().print(table)
    write_benchmarks(bench.figures(result), out)
    console.print(f"updated {out}")
    if as_json:
        print(json.dumps({"requests": result["requests"], "events": result["events"], **{
            key: {"median": m.median, "values": list(m.values), "load_average": m.load_average}
            for key, m in repeated.items()}}))


def register(app: typer.Typer) -> None:
    from entroloop.cli.bench import add_benchmark

    add_benchmark("workers", workers)
