"""Commands of the distributed mode: `entroloop worker` (Faust) and `entroloop fleet` (publish to Kafka)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from entroloop.benchmarks.repeats import DEFAULT_RUNS
from entroloop.cli.common import settings_or_exit
from entroloop.contract.settings import Settings, load_settings

console = Console(stderr=True)
out = Console()

Broker = Annotated[
    str | None,
    typer.Option("--broker", "-b", help="Kafka bootstrap HOST:PORT (or kafka://HOST:PORT); default ENTROLOOP_KAFKA_BOOTSTRAP."),
]
TopicPrefix = Annotated[
    str | None, typer.Option("--topic-prefix", help="Prefix of every topic name; default ENTROLOOP_TOPIC_PREFIX.")
]


def broker_address(value: str) -> str:
    """``kafka://h:p,h2:p2`` or ``h:p`` -> ``h:p,h2:p2`` (librdkafka's bootstrap form)."""
    return ",".join(part.strip().removeprefix("kafka://") for part in value.split(",") if part.strip())


def distributed_settings(broker: str | None, topic_prefix: str | None, **extra: Any) -> Settings:
    overrides: dict[str, Any] = dict(extra)
    if broker:
        overrides["kafka_bootstrap"] = broker_address(broker)
    if topic_prefix is not None:
        overrides["topic_prefix"] = topic_prefix
    settings = settings_or_exit(**overrides)
    if not settings.kafka_bootstrap:
        console.print("[red]No broker: pass --broker HOST:PORT or set ENTROLOOP_KAFKA_BOOTSTRAP "
                      "(`make services-up` starts a local one and writes it to .services.env).[/red]")
        raise typer.Exit(2)
    return settings


def bench_publisher(
    broker: Broker = None,
    events: Annotated[int, typer.Option(help="Records to publish per round and side.")] = 200_000,
    runs: Annotated[int, typer.Option(min=1, help="Rounds (publisher and bare Producer each); the report gives "
                                                  "medians, spreads and load averages.")] = DEFAULT_RUNS,
    out: Annotated[Path, typer.Option("--out", help="The Markdown report to update.")] = Path("BENCHMARKS.md"),
    as_json: Annotated[bool, typer.Option("--json", help="End with the results as one JSON line.")] = False,
) -> None:
    """Hot-path publish() latency (p50/p99) and throughput delivered to a real broker."""
    from entroloop.benchmarks import publisher as bench
    from entroloop.benchmarks.report import Figure, write_benchmarks

    bootstrap = broker_address(broker) if broker else load_settings().kafka_bootstrap
    if not bootstrap:
        # `entroloop bench all` must go on without a broker: say so in the report instead.
        console.print("[yellow]bench publisher: no broker (--broker or ENTROLOOP_KAFKA_BOOTSTRAP); skipped[/yellow]")
        write_benchmarks([Figure("publisher", "publish() p99", None, "µs", note="not measured: no broker; run `make services-up`")], out)
        return
    with console.status("publisher bench") as status:
        result = bench.run(bootstrap, events, runs=runs, progress=status.update)
    console.print(
        f"publish() p50 {result['p50_us']:.2f} µs, p99 {result['p99_us']:.2f} µs, max {result['max_us']:.0f} µs; "
        f"delivered {result['delivered_per_s'] or 0:,.0f} events/s; counters {result['stats']}"
    )
    write_benchmarks(bench.figures(result), out)
    if as_json:
        print(json.dumps({k: v for k, v in result.items() if k != "stats"}))


def register(app: typer.Typer) -> None:
    # `entroloop bench publisher` joins the lead's bench group through its extension point.
    from entroloop.cli.bench import add_benchmark

    add_benchmark("publisher", bench_publisher)

    @app.command()
    def worker(
        broker: Broker = None,
        topic_prefix: TopicPrefix = None,
        loglevel: Annotated[str, typer.Option("--log-level", help="Log level: critical, error, warning, info, debug.")] = "warning",
        role: Annotated[str, typer.Option(
            "--role",
            help="all: every processor (one worker). To scale: workers with `requests` (entropy, baselines, "
                 "bad-case join, intent: up to one per partition) beside exactly one with `aggregates` "
                 "(fallback rates, rule counts, retrain triggers: counts over every request, which one "
                 "worker must see whole).")] = "all",
    ) -> None:
        """Run a Faust stream worker: the pipeline's analytics processors, consuming from Kafka.

        One worker runs everything (`--role all`). The topics are keyed by request id, so with more workers each reads some partitions: the processors that judge one request at a time scale that way (`--role requests`, up to one worker per partition), while those that count over every request of a model and route (fallback rates, rule counts, retrain triggers) run in exactly one worker of their own (`--role aggregates`). Alert actions (runbooks, webhooks) run in their own process: `entroloop actions`. Each agent runs one actor per process (the faust-streaming issue 606 guard).
        """
        from entroloop.infra.metrics import serve_metrics
        from entroloop.streams.app import build_streams_app
        from entroloop.streams.defaults import (
            APP_ID_OF_ROLE,
            WORKER_ROLES,
            processors_for_role,
        )

        if role not in WORKER_ROLES:
            raise typer.BadParameter(f"{role!r}: choose one of {', '.join(WORKER_ROLES)}", param_hint="--role")
        settings = distributed_settings(broker, topic_prefix)
        serve_metrics(settings.metrics_port)
        streams = build_streams_app(settings, processors=processors_for_role(settings, role), app_id=APP_ID_OF_ROLE[role])
        console.print(f"worker ({role}): {len(streams.processors)} processors on {', '.join(streams.input_topics)} "
                      f"via {settings.kafka_bootstrap}")
        streams.run(loglevel=loglevel)

    @app.command()
    def fleet(
        requests: Annotated[int, typer.Option("--requests", "-n", min=1, help="Requests the synthetic fleet serves.")] = 2000,
        broker: Broker = None,
        topic_prefix: TopicPrefix = None,
        seed: Annotated[int, typer.Option(help="Seed of the synthetic fleet (same seed, same traffic).")] = 7,
        rate: Annotated[float, typer.Option(help="Requests per second (0: as fast as possible).")] = 0.0,
        spool_dir: Annotated[Path | None, typer.Option(help="Publisher spool folder (default DATA_DIR/spool).")] = None,
        flush_timeout: Annotated[float, typer.Option(help="Seconds to wait for delivery at the end.")] = 120.0,
        as_json: Annotated[bool, typer.Option("--json", help="Print the counters as one JSON line.")] = False,
    ) -> None:
        """Publish a synthetic serving fleet's events to Kafka through the node publisher."""
        from entroloop.collectors.publisher import Publisher
        from entroloop.collectors.synthetic_fleet import SyntheticFleet
        from entroloop.infra.kafka_topics import ensure_topics

        settings = distributed_settings(broker, topic_prefix)
        ensure_topics(settings.kafka_bootstrap, settings.topic_prefix, settings.partitions)
        overrides = {"spool_dir": spool_dir} if spool_dir else {}
        publisher = Publisher.from_settings(settings, **overrides)
        published = 0
        started = time.monotonic()
        for i, request in enumerate(SyntheticFleet(seed=seed).requests(requests)):
            for record in request.records:
                publisher.publish(record)
                published += 1
            if rate > 0:
                ahead = (i + 1) / rate - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
        publish_s = time.monotonic() - started
        delivered = publisher.flush(flush_timeout)
        stats = publisher.close(timeout=5.0)
        summary = {
            "requests": requests,
            "events": published,
            "publish_s": round(publish_s, 3),
            "total_s": round(time.monotonic() - started, 3),
            "delivered_all": delivered,
            **stats,
        }
        if as_json:
            out.print(json.dumps(summary))
        else:
            out.print(" ".join(f"{k}={v}" for k, v in summary.items()))
        if not delivered or stats["dropped"]:
            raise typer.Exit(1)
