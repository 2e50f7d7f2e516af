"""`entroloop actions`: the alert action runner of the distributed deployment (``streams/actions/consumer.py``)."""

from __future__ import annotations

import logging
import time
from typing import Annotated, Any

import typer
from rich.console import Console

from entroloop.cli.common import broker_problem, print_json
from entroloop.cli.distributed import Broker, TopicPrefix, distributed_settings

console = Console(stderr=True)

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
RECONNECT_AFTER_S = 5.0


def _case_bundle_query(settings: Any) -> Any:
    """``query(sql)`` on the configured ClickHouse for case bundles, connecting on first use and again
    after a failure (ClickHouse may start after this process; a failed bundle step is reported, not fatal)."""
    from entroloop.infra.clickhouse.client import connect
    from entroloop.streams.actions import client_query

    dsn, password = settings.resolved_clickhouse_dsn(), settings.clickhouse_password.get_secret_value()
    if dsn.startswith("chdb://"):
        console.print(f"[yellow]actions: case bundles read the embedded ClickHouse {dsn}; chDB allows one process "
                      "per folder, so point ENTROLOOP_CLICKHOUSE_DSN at a ClickHouse server when a sink runs too[/yellow]",
                      soft_wrap=True)
    client: list[Any] = []
    connected_at = [0.0]

    def query(sql: str) -> list[dict[str, Any]]:
        if not client:
            client.append(connect(dsn, password))
            connected_at[0] = time.monotonic()
        try:
            return client_query(client[0])(sql)
        except Exception:
            # reconnect next time, unless the connection is fresh: then the query failed, not the
            # connection (a table not there yet), and connecting again per alert would cost more than the query
            if time.monotonic() - connected_at[0] > RECONNECT_AFTER_S:
                client.clear()
            raise

    return query


def actions(
    broker: Broker = None,
    topic_prefix: TopicPrefix = None,
    until_idle: Annotated[bool, typer.Option("--until-idle", help="Handle the alerts there are, then exit.")] = False,
    session_timeout_s: Annotated[float, typer.Option(
        min=6, help="Kafka session timeout: how soon a dead runner's partitions move to another.")] = 30.0,
    concurrency: Annotated[int, typer.Option(
        min=1, help="Runbook executions of one batch of alerts whose steps (webhooks) run at once; those of one "
                    "runbook on one target stay in order.")] = 8,
    as_json: Annotated[bool, typer.Option("--json", help="End with the final counters as one JSON line.")] = False,
    log_level: Annotated[str, typer.Option("--log-level", help="Log level: critical, error, warning, info, debug.")] = "warning",
) -> None:
    """Run the alert runbooks: consume the alerts topic, execute each matching runbook once per alert
    key (webhooks to the gateway admin API, case bundles, retrain requests) and publish an Action
    record per step to the actions topic.

    Its own process, so a slow webhook never holds up the stream worker. Alerts are handled in batches
    of what one poll fetched (state writes, deliveries and commits shared). At least once: records are
    delivered before an alert's offset is committed, and executions are remembered in
    ENTROLOOP_ACTIONS_STATE_PATH so a redelivered alert never calls a webhook twice. Runbooks come from
    ENTROLOOP_ACTIONS_RUNBOOKS_DIR (default: the packaged ones); ENTROLOOP_ACTIONS_DRY_RUN=false acts for real.
    """
    import signal

    from entroloop.contract.records import Action, Alert, DeadLetter, RetrainRequest
    from entroloop.contract.topics import TOPIC_BY_TYPE
    from entroloop.infra.kafka_record_loop import DeliveryFailed
    from entroloop.infra.kafka_topics import ensure_topics
    from entroloop.infra.metrics import serve_metrics
    from entroloop.streams.actions import ActionRunner, RunbookError
    from entroloop.streams.actions.consumer import ActionConsumer
    from entroloop.streams.actions.runbooks import runbooks_from_settings

    if log_level.lower() not in LOG_LEVELS:
        console.print(f"[red]--log-level must be one of {', '.join(LOG_LEVELS)}[/red]")
        raise typer.Exit(2)
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    settings = distributed_settings(broker, topic_prefix)
    try:  # before the broker: a bad runbook folder is the first thing to fix
        runbooks_from_settings(settings)
    except RunbookError as exc:
        console.print(f"[red]actions: {exc}[/red]", soft_wrap=True)
        raise typer.Exit(2) from None
    problem = broker_problem(settings.kafka_bootstrap)
    if problem:
        console.print(f"[red]actions: Kafka broker {settings.kafka_bootstrap} does not answer ({problem}).[/red] "
                      "Check --broker / ENTROLOOP_KAFKA_BOOTSTRAP.", soft_wrap=True)
        raise typer.Exit(2)
    runner = ActionRunner.from_settings(settings, query=_case_bundle_query(settings), outbox=True, concurrency=concurrency)
    # subscribing to a topic that does not exist yet would wait for a metadata refresh (minutes)
    ensure_topics(settings.kafka_bootstrap, settings.topic_prefix, settings.partitions,
                  topics=[TOPIC_BY_TYPE[t] for t in (Alert, Action, RetrainRequest, DeadLetter)])
    consumer = ActionConsumer(settings, runner, session_timeout_s=session_timeout_s)
    serve_metrics(settings.metrics_port)  # ENTROLOOP_METRICS_PORT: records in/out, dead letters, actions, last commit

    def stop(_signum: int, _frame: Any) -> None:
        consumer.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    mode = "dry run (ENTROLOOP_ACTIONS_DRY_RUN=true)" if settings.actions_dry_run else "acting for real"
    console.print(f"actions: {len(runner.runbooks)} runbooks ({', '.join(r.name for r in runner.runbooks)}), {mode}; "
                  f"group {consumer.loop.group_id} on {consumer.loop.kafka_topic} via {settings.kafka_bootstrap}",
                  soft_wrap=True)
    try:
        stats = consumer.run(until_idle=until_idle)
    except DeliveryFailed as exc:
        console.print(f"[red]actions: {exc}; the alert was not committed and the records stay in the outbox "
                      f"({runner.state.path}) for the next start.[/red]", soft_wrap=True)
        raise typer.Exit(1) from None
    finally:
        runner.close()
        runner.state.close()
    if as_json:
        print_json(stats)
    else:
        console.print("actions: " + " ".join(f"{k}={v}" for k, v in stats.items()))


def register(app: typer.Typer) -> None:
    app.command("actions")(actions)
