"""``entroloop bench lag``: emit -> queryable lag per event (p50/p95/p99) at a stated request rate,
through a real Kafka broker and a ClickHouse sink process (entroloop/benchmarks/lag.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

console = Console(stderr=True)


def lag(
    rate: Annotated[float, typer.Option(min=1, help="Requests per second the fleet publishes.")] = 2000,
    seconds: Annotated[float, typer.Option(min=1, help="How long the sustained run lasts.")] = 60,
    broker: Annotated[str | None, typer.Option("--broker", "-b", help="Kafka bootstrap HOST:PORT (default ENTROLOOP_KAFKA_BOOTSTRAP).")] = None,
    partitions: Annotated[int, typer.Option(min=1, help="Partitions per topic (the sink writes one batch per partition).")] = 6,
    batch_seconds: Annotated[float, typer.Option(help="The sink's batch time bound (ENTROLOOP_SINK_BATCH_SECONDS).")] = 1.0,
    out: Annotated[Path, typer.Option("--out", help="The Markdown report to update.")] = Path("BENCHMARKS.md"),
    as_json: Annotated[bool, typer.Option("--json", help="End with the results as one JSON line.")] = False,
) -> None:
    """Sustained fleet -> Kafka -> ClickHouse sink run; lag from emit to queryable, per event."""
    from entroloop.benchmarks import lag as bench
    from entroloop.benchmarks.report import write_benchmarks
    from entroloop.cli.distributed import broker_address
    from entroloop.contract.settings import load_settings

    bootstrap = broker_address(broker) if broker else load_settings().kafka_bootstrap
    problem = bench.broker_problem(bootstrap)
    if problem:
        # `entroloop bench all` goes on without a broker: the report says why there is no figure.
        console.print(f"[yellow]bench lag: not measured: {problem}. Start one with `make services-up` "
                      "(or `bash scripts/services.sh up kafka`) and set ENTROLOOP_KAFKA_BOOTSTRAP.[/yellow]")
        write_benchmarks(bench.not_measured(problem), out)
        return
    with console.status("lag benchmark") as status:
        result = bench.run(bootstrap, rate=rate, seconds=seconds, partitions=partitions, batch_seconds=batch_seconds,
                           progress=lambda text: status.update(f"bench lag: {text}"))
    table = Table("figure", "value")
    for key in ("achieved_requests_per_s", "events_per_s", "events_sent", "events_stored", "p50_s", "p95_s", "p99_s", "max_s"):
        value = result[key]
        table.add_row(key, f"{value:,.3f}" if isinstance(value, float) else f"{value:,}")
    Console().print(table)
    if result["events_stored"] != result["events_sent"]:
        console.print(f"[red]bench lag: {result['events_sent'] - result['events_stored']:,} events not stored[/red]")
    write_benchmarks(bench.figures(result), out)
    console.print(f"updated {out}")
    if as_json:
        print(json.dumps({k: v for k, v in result.items() if k not in ("publisher", "sink")}))


def register(app: typer.Typer) -> None:
    from entroloop.cli.bench import add_benchmark

    add_benchmark("lag", lag)
