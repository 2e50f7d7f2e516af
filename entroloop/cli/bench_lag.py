"""``entroloop bench lag``: emit -> queryable lag per event (p50/p95/p99) at stated request rates,
through a real Kafka broker and a ClickHouse sink process, and emit -> alert / action lag through
`entroloop worker` and `entroloop actions` (entroloop/benchmarks/lag.py); each figure the median of
several runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from entroloop.benchmarks.lag import DEFAULT_BATCH_SECONDS

console = Console(stderr=True)


def lag(
    rates: Annotated[str, typer.Option(help="Comma-separated requests/s the fleet publishes, one phase each.")] = "2000,5000",
    seconds: Annotated[float, typer.Option(min=1, help="How long each sustained run publishes.")] = 15,
    runs: Annotated[int, typer.Option(min=1, help="Runs per phase; a figure is their median.")] = 3,
    broker: Annotated[str | None, typer.Option("--broker", "-b", help="Kafka bootstrap HOST:PORT (default ENTROLOOP_KAFKA_BOOTSTRAP).")] = None,
    partitions: Annotated[int, typer.Option(min=1, help="Partitions per topic.")] = 6,
    batch_seconds: Annotated[float, typer.Option(min=0.01, help="The sink's batch time bound (ENTROLOOP_SINK_BATCH_SECONDS; the oldest row of a batch waits that long, so p99 cannot be lower). 0.8 s: about 1.3 inserts per table per second and p99 under 1 s at 2,000 requests/s here; the sink's own default, 1 s, gives one insert per second and p99 above 1 s.")] = DEFAULT_BATCH_SECONDS,
    alerts: Annotated[bool, typer.Option("--alerts/--no-alerts", help="Also measure emit -> alert and -> action through `entroloop worker` and `entroloop actions`.")] = True,
    baseline_checkout: Annotated[Path | None, typer.Option(help="Also run the sink (at the first rate) and `entroloop actions` (in the alert phase) from this checkout (e.g. a worktree of the previous commit), in the same runs: before/after side by side.")] = None,
    baseline_of: Annotated[str, typer.Option(help="Which parts --baseline-checkout runs from that checkout, comma-separated: sink, actions.")] = "sink,actions",
    out: Annotated[Path, typer.Option("--out", help="The Markdown report to update.")] = Path("BENCHMARKS.md"),
    as_json: Annotated[bool, typer.Option("--json", help="End with the medians as one JSON line.")] = False,
) -> None:
    """Sustained fleet -> Kafka -> ClickHouse sink runs; lag from emit to queryable, per event; then
    emit -> alert and -> action through the Faust workers."""
    from entroloop.benchmarks import lag as bench
    from entroloop.benchmarks.report import write_benchmarks
    from entroloop.cli.distributed import broker_address
    from entroloop.contract.settings import load_settings

    try:
        rate_list = tuple(float(r) for r in rates.split(",") if r.strip())
    except ValueError:
        raise typer.BadParameter(f"--rates {rates!r}: give numbers separated by commas, e.g. 2000,5000") from None
    if not rate_list or min(rate_list) <= 0:
        raise typer.BadParameter("--rates: give at least one positive request rate, e.g. 2000,5000")
    parts = tuple(p.strip() for p in baseline_of.split(",") if p.strip())
    if not parts or set(parts) - set(bench.BASELINE_PARTS):
        raise typer.BadParameter(f"--baseline-of {baseline_of!r}: give one or more of {', '.join(bench.BASELINE_PARTS)}")
    if baseline_checkout is not None and (problem := bench.checkout_problem(baseline_checkout)):
        raise typer.BadParameter(f"--baseline-checkout: {problem}")
    bootstrap = broker_address(broker) if broker else load_settings().kafka_bootstrap
    problem = bench.broker_problem(bootstrap)
    if problem:
        # `entroloop bench all` goes on without a broker: the report says why there is no figure.
        console.print(f"[yellow]bench lag: not measured: {problem}. Start one with `make services-up` "
                      "(or `bash scripts/services.sh up kafka`) and set ENTROLOOP_KAFKA_BOOTSTRAP.[/yellow]")
        write_benchmarks(bench.not_measured(problem), out)
        return
    with console.status("lag benchmark") as status:
        result = bench.run(bootstrap, rates=rate_list, seconds=seconds, runs=runs, partitions=partitions,
                           batch_seconds=batch_seconds, alerts=alerts, baseline_checkout=baseline_checkout,
                           baseline_of=parts,
                           progress=lambda text: status.update(f"bench lag: {text}"))
    figures = bench.figures(result)
    table = Table("figure", "median", "unit", "runs (spread)", "load")
    for f in figures:
        table.add_row(f.name, f.cell(), f.unit, f"{f.runs} ({f.spread})" if f.spread else str(f.runs),
                      "" if f.load_average is None else f"{f.load_average:.1f}")
    Console().print(table)
    for rate, measured in result["queryable"].items():
        if measured["lost"].high:
            console.print(f"[red]bench lag: events not stored at {rate:,.0f} requests/s (worst run "
                          f"{measured['lost'].high:,.0f})[/red]")
    write_benchmarks(figures, out)
    console.print(f"updated {out}")
    if as_json:
        print(json.dumps(bench.summary(result)))


def register(app: typer.Typer) -> None:
    from entroloop.cli.bench import add_benchmark

    add_benchmark("lag", lag)
