"""`entroloop sink clickhouse` and `entroloop sink audit`: the sinks as Kafka consumers.

Settings come from ``ENTROLOOP_*`` (options override the broker and topic prefix). SIGTERM and
Ctrl-C finish cleanly: buffered batches are written, their offsets committed, the group left, and
the command exits 0. A broker that does not answer or missing settings end with exit 2 and one line
that says what to set.
"""

from __future__ import annotations

import json
import logging
import signal
from typing import Annotated, Any

import typer
from rich.console import Console

from entroloop.cli.distributed import Broker, TopicPrefix, distributed_settings

console = Console(stderr=True)

UntilEmpty = Annotated[
    bool, typer.Option("--until-empty", help="Exit once every assigned partition is drained and committed (tests, backfills).")
]
MaxIdle = Annotated[
    float | None, typer.Option("--max-idle-s", min=0, help="Exit after this many seconds without a message.")
]
BatchRows = Annotated[int | None, typer.Option(help="Rows per insert and table, all partitions together (default ENTROLOOP_SINK_BATCH_ROWS).")]
BatchSeconds = Annotated[
    float | None, typer.Option(help="Longest a batch's oldest row waits, counted from its append to Kafka, before the write (default ENTROLOOP_SINK_BATCH_SECONDS).")
]
SessionTimeout = Annotated[
    float, typer.Option(min=6, help="Kafka session timeout: how soon a crashed sink's partitions move to another.")
]
AsJson = Annotated[bool, typer.Option("--json", help="Print the final counters as one JSON line on stdout.")]
LogLevel = Annotated[str, typer.Option("--log-level", help="Log level: critical, error, warning, info, debug.")]


def _broker_answers(bootstrap: str, timeout: float = 10.0) -> str | None:
    """None if the broker answers a metadata request, else why not."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    try:
        AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=timeout)
    except KafkaException as exc:
        return str(exc.args[0])
    return None


def run_sink(kind: str, settings: Any, until_empty: bool, max_idle_s: float | None, as_json: bool,
             loglevel: str, **options: Any) -> None:
    """Build the sink ``kind``, run it until told to stop, print its counters."""
    from entroloop.infra.kafka_topics import ensure_topics
    from entroloop.sinks.kafka_sink import SINK_FACTORIES

    logging.basicConfig(level=loglevel.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    problem = _broker_answers(settings.kafka_bootstrap)
    if problem:
        console.print(f"[red]sink {kind}: Kafka broker {settings.kafka_bootstrap} does not answer ({problem}). "
                      "Check ENTROLOOP_KAFKA_BOOTSTRAP / --broker; `make services-up` starts a local broker.[/red]")
        raise typer.Exit(2)
    # subscribing to a topic that does not exist yet would wait for a metadata refresh (minutes)
    ensure_topics(settings.kafka_bootstrap, settings.topic_prefix, settings.partitions)
    from entroloop.infra.metrics import serve_metrics

    serve_metrics(settings.metrics_port)
    try:
        sink = SINK_FACTORIES[kind](settings, **options)
    except Exception as exc:  # noqa: BLE001 - settings and storage problems end in one readable line
        console.print(f"[red]sink {kind}: cannot open its store: {type(exc).__name__}: {exc}[/red]")
        raise typer.Exit(2) from None

    def stop(signum: int, _frame: Any) -> None:
        sink.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    console.print(f"sink {kind}: group {sink.group_id}, {len(sink.topics)} topic(s) via {settings.kafka_bootstrap}")
    stats = sink.run(until_empty=until_empty, max_idle_s=max_idle_s).as_dict()
    if as_json:
        print(json.dumps({"sink": kind, **stats}), flush=True)
    else:
        console.print(f"sink {kind}: " + " ".join(f"{k}={v}" for k, v in stats.items()))


def register(app: typer.Typer) -> None:
    sink_app = typer.Typer(help="Sinks as Kafka consumers: durable write first, offset commit after.",
                           no_args_is_help=True)
    app.add_typer(sink_app, name="sink")

    @sink_app.command("clickhouse")
    def clickhouse(
        broker: Broker = None,
        topic_prefix: TopicPrefix = None,
        until_empty: UntilEmpty = False,
        max_idle_s: MaxIdle = None,
        batch_rows: BatchRows = None,
        batch_seconds: BatchSeconds = None,
        session_timeout_s: SessionTimeout = 30.0,
        as_json: AsJson = False,
        loglevel: LogLevel = "warning",
    ) -> None:
        """Every topic into its ClickHouse table (ENTROLOOP_CLICKHOUSE_DSN), idempotent per offset range."""
        settings = distributed_settings(broker, topic_prefix)
        run_sink("clickhouse", settings, until_empty, max_idle_s, as_json, loglevel, max_rows=batch_rows,
                 max_seconds=batch_seconds, session_timeout_s=session_timeout_s)

    @sink_app.command("audit")
    def audit(
        broker: Broker = None,
        topic_prefix: TopicPrefix = None,
        until_empty: UntilEmpty = False,
        max_idle_s: MaxIdle = None,
        batch_rows: Annotated[int | None, typer.Option(help="Audit or action records per batch (default ENTROLOOP_AUDIT_BATCH_RECORDS).")] = None,
        batch_seconds: BatchSeconds = None,
        session_timeout_s: SessionTimeout = 30.0,
        create_bucket: Annotated[bool, typer.Option(help="Create the S3 bucket with Object Lock if missing.")] = False,
        as_json: AsJson = False,
        loglevel: LogLevel = "warning",
    ) -> None:
        """The audit and actions topics into write-once Parquet with hash-chained manifests (ENTROLOOP_AUDIT_STORE)."""
        settings = distributed_settings(broker, topic_prefix)
        options: dict[str, Any] = {"max_seconds": batch_seconds, "session_timeout_s": session_timeout_s}
        if batch_rows:
            options["max_rows"] = batch_rows
        run_sink("audit", settings, until_empty, max_idle_s, as_json, loglevel, create_bucket=create_bucket, **options)
