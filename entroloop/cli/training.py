"""Commands of the retraining loop: ``trainer`` (consumer), ``train`` (one job), ``adapters ...``.

torch, transformers and peft are imported only when a job actually trains, so these commands are
listed by ``entroloop --help`` in the light virtualenv; training itself needs .venv-ml.

Embedded mode: retrain requests are read from the embedded bus log (DATA_DIR/log), training data
(bad cases, audits, feedback) too, and every Action record is appended to the bus's actions topic,
from where the runner's sinks put it in ClickHouse and the audit log.

Distributed mode (ENTROLOOP_KAFKA_BOOTSTRAP or ``--broker`` set): ``trainer`` consumes the retrain
topic from Kafka (``entroloop.training.consumer``), training data comes from ClickHouse and the WORM audit log
(``entroloop.training.sources.WarehouseSource``), and Action records go to the actions topic through the node
publisher, from where the sinks store them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from entroloop.cli.common import embedded_store_or_exit, print_json, settings_or_exit
from entroloop.cli.distributed import Broker, TopicPrefix, broker_address

console = Console(stderr=True)
out = Console()

AsJson = Annotated[bool, typer.Option("--json", help="End with the result as one JSON line on stdout.")]

DataDir = Annotated[
    Path | None,
    typer.Option("--data-dir", "-d", help="Embedded data folder (default: ENTROLOOP_DATA_DIR or ./.entroloop)."),
]


def _settings(data_dir: Path | None) -> Any:
    return settings_or_exit(data_dir=data_dir)


def _training_dir(settings: Any) -> Path:
    return Path(settings.training_dir or Path(settings.data_dir) / "training")


def _bus_emitter(settings: Any):
    """Append Action records to the embedded bus's actions topic (idempotent by event id)."""
    from entroloop.contract.codec import encode
    from entroloop.contract.topics import topic_of
    from entroloop.infra.bus import LocalLog

    log = LocalLog(Path(settings.data_dir) / "log", settings.partitions)

    def emit(record: Any) -> None:
        log.append(topic_of(record).name, record.request_id, encode(record), record.event_id)
        log.flush()

    return emit


_publishers: list[Any] = []


def _kafka_publisher(settings: Any) -> Any:
    """The node publisher (one per process, closed at exit by its own atexit hook)."""
    if not _publishers:
        from entroloop.collectors.publisher import Publisher

        _publishers.append(Publisher.from_settings(settings, client_id=f"entroloop-trainer-{settings.node_id}"))
    return _publishers[0]


def _actions(settings: Any):
    """Action records to the actions topic: Kafka in distributed mode, else the embedded bus."""
    from entroloop.training.actions import ActionLog

    emit = _kafka_publisher(settings).publish if settings.kafka_bootstrap else _bus_emitter(settings)
    return ActionLog(emit, node_id=f"trainer@{settings.node_id}")


def _registry(settings: Any, actions: Any):
    from entroloop.infra.clickhouse.client import ClickHouseLocked, connect
    from entroloop.infra.worm.worm_store import LocalWormStore
    from entroloop.training.registry import AdapterRegistry

    store = LocalWormStore(Path(settings.adapter_store_dir or Path(settings.data_dir) / "adapters"))
    try:
        client = connect(settings.resolved_clickhouse_dsn(), settings.clickhouse_password.get_secret_value())
    except ClickHouseLocked as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(3) from None
    registry = AdapterRegistry(store, client, settings.clickhouse_database, actions)
    registry.ensure_schema()
    return registry


def _source(settings: Any, records: list[Path] | None, registry: Any = None):
    from entroloop.training.pipeline import BusSource, JsonLinesSource

    if records:
        return JsonLinesSource(list(records))
    if settings.kafka_bootstrap:
        return _warehouse_source(settings, registry)
    return BusSource(Path(settings.data_dir) / "log", settings.partitions)


def _warehouse_source(settings: Any, registry: Any = None):
    """Distributed training data: ids from ClickHouse, accepted answers from the WORM audit log."""
    from entroloop.infra.clickhouse.client import connect
    from entroloop.infra.worm.stores import open_worm_store
    from entroloop.training.sources import WarehouseSource

    if registry is not None:  # the registry's connection (chDB allows one per data folder)
        client, database = registry.client, registry.database
    else:
        client = connect(settings.resolved_clickhouse_dsn(), settings.clickhouse_password.get_secret_value())
        database = settings.clickhouse_database
    return WarehouseSource(client, database, open_worm_store(settings),
                           replay_ratio=settings.train_replay_ratio,
                           negative_rating=settings.badcase_negative_rating)


def _served(settings: Any, registry: Any, adapter_id: str) -> Path:
    """The adapter's files, checked against its manifest, in the folder the vLLM servers load from."""
    served = Path(settings.adapter_store_dir or Path(settings.data_dir) / "adapters") / "served" / adapter_id
    registry.fetch(adapter_id, served)  # every file checked against the manifest
    return served.resolve()


def rollback_adapter(settings: Any, registry: Any, actions: Any, adapter_id: str, reason: str) -> str:
    """Roll ``adapter_id`` back by hand; return the model (adapter id or base) that now serves.

    The router is rebuilt from the registry's status history (the durable routing state), so the
    rollback knows whether the adapter is the promoted one or a canary; the new routing is written
    back there (``adapter_status``) and every step is an Action record.
    """
    from entroloop.training.publisher import (
        AdapterPublisher,
        CanaryPolicy,
        CanaryRouter,
        VllmLoraClient,
    )

    model = registry.manifest(adapter_id).model
    router = CanaryRouter.from_routing(settings.base_model_name or model, registry.routing(model))
    publisher = AdapterPublisher(
        [VllmLoraClient(url) for url in settings.vllm_servers], router,
        lambda *_: None, CanaryPolicy.from_settings(settings), actions, registry,  # type: ignore[arg-type,return-value]
    )
    return publisher.rollback_by_hand(adapter_id, reason, lambda parent: str(_served(settings, registry, parent)))


def _rollout(settings: Any, registry: Any, actions: Any):
    """The job's last step when ENTROLOOP_VLLM_SERVERS is set: load the accepted adapter into every
    server and run the canary. The share of each stage is recorded in ``adapter_status``, which is
    what gateways read to route (the router here is this process's view of it)."""
    from entroloop.training.publisher import (
        AdapterPublisher,
        CanaryPolicy,
        CanaryRouter,
        ClickHouseCanaryMetrics,
        VllmLoraClient,
    )

    def publish(adapter_id: str) -> dict[str, Any]:
        model = registry.manifest(adapter_id).model
        served = _served(settings, registry, adapter_id)
        router = CanaryRouter(settings.base_model_name or model, stable=registry.promoted(model))
        publisher = AdapterPublisher(
            [VllmLoraClient(url) for url in settings.vllm_servers], router,
            ClickHouseCanaryMetrics(registry.client, registry.database), CanaryPolicy.from_settings(settings),
            actions, registry,
        )
        result = publisher.rollout(adapter_id, str(served))
        return result.to_dict()

    return publish


def _runner(settings: Any, records: list[Path] | None, dry_run: bool):
    from entroloop.training.jobs import JobRunner, JobStore
    from entroloop.training.pipeline import TrainingPipeline

    actions = _actions(settings)
    registry = None if dry_run else _registry(settings, actions)
    publish = _rollout(settings, registry, actions) if registry is not None and settings.vllm_servers else None
    try:
        pipeline = TrainingPipeline(settings, _source(settings, records, registry), registry, publish=publish)
    except ValueError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    return JobRunner(JobStore(_training_dir(settings)), pipeline.steps(), actions)


def run_kafka_trainer(settings: Any, runner: Any, once: bool = False, session_timeout_s: float = 30.0
                      ) -> dict[str, Any]:
    """Consume the retrain topic from Kafka into ``runner`` until SIGTERM (or, ``once``, until idle)."""
    import signal

    from entroloop.cli.sinks import _broker_answers
    from entroloop.contract.records import Action, DeadLetter, RetrainRequest
    from entroloop.contract.topics import TOPIC_BY_TYPE
    from entroloop.infra.kafka_topics import ensure_topics
    from entroloop.training.consumer import RetrainConsumer

    problem = _broker_answers(settings.kafka_bootstrap)
    if problem:
        console.print(f"[red]trainer: Kafka broker {settings.kafka_bootstrap} does not answer ({problem}).[/red]")
        raise typer.Exit(2)
    # subscribing to a topic that does not exist yet would wait for a metadata refresh (minutes)
    ensure_topics(settings.kafka_bootstrap, settings.topic_prefix, settings.partitions,
                  topics=[TOPIC_BY_TYPE[t] for t in (RetrainRequest, DeadLetter, Action)])
    publisher = _kafka_publisher(settings)
    consumer = RetrainConsumer(settings, runner, publisher, session_timeout_s=session_timeout_s)

    def stop(_signum: int, _frame: Any) -> None:
        consumer.stop()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    console.print(f"trainer: group {consumer.group_id}, topic {consumer.topic} via {settings.kafka_bootstrap}")
    stats = consumer.run(until_idle=once).as_dict()
    stats["publisher"] = publisher.close()
    return stats


def _consume_bus(settings: Any, once: bool, poll_seconds: float, as_json: bool = False) -> None:
    """The embedded mode's consumer: the bus log, offsets in a file, jobs run inline."""
    from entroloop.contract.codec import CodecError, decode
    from entroloop.contract.records import RetrainRequest
    from entroloop.infra.bus import LocalLog, OffsetStore

    runner = _runner(settings, None, dry_run=False)
    for job in runner.resume_all():
        console.print(f"resumed {job.trigger_key}: {job.state}")
    offsets = OffsetStore(_training_dir(settings) / "offsets.json")
    topic = RetrainRequest.topic
    while True:
        log = LocalLog(Path(settings.data_dir) / "log", settings.partitions)
        for partition in range(settings.partitions):
            start, stop = offsets.get(topic, partition), log.end_offset(topic, partition)
            for offset, (_key, value) in enumerate(log.read(topic, partition, start, stop), start):
                try:
                    record = decode(value)
                except CodecError:
                    record = None
                if isinstance(record, RetrainRequest):
                    try:
                        job = runner.submit(record)
                    except Exception as exc:  # the job is marked failed with its reason; keep consuming
                        console.print(f"[red]{record.trigger_key}: {type(exc).__name__}: {exc}[/red]")
                        job = None
                    if job is not None:
                        _print_job(job, as_json)
                # Committed only after the job ran (or was a duplicate): a crash re-reads the
                # request, and the job folder makes that a resume, never a second job.
                offsets.commit(topic, partition, offset + 1)
                offsets.save()
        log.close()
        if once:
            return
        time.sleep(poll_seconds)


def _print_job(job: Any, as_json: bool = False) -> None:
    status = job.status()
    summary = {"trigger_key": status["trigger_key"], "state": status["state"], "attempts": status["attempts"]}
    results = status.get("results", {})
    if "gate" in results:
        summary["gate"] = {k: results["gate"].get(k) for k in ("accepted", "adapter_pass_rate", "parent_pass_rate",
                                                               "adapter_loss", "parent_loss", "reasons")}
    if "register" in results:
        summary["adapter_id"] = results["register"]["adapter_id"]
    if "error" in status:
        summary["error"] = status["error"]
    if as_json:
        print_json(summary)
    else:
        out.print_json(json.dumps(summary, default=str))


def register(app: typer.Typer) -> None:
    @app.command()
    def train(
        request: Annotated[Path, typer.Option("--request", "-r", exists=True, dir_okay=False,
                                              help="RetrainRequest as JSON (the record's fields).")],
        records: Annotated[list[Path] | None, typer.Option(
            "--records", help="JSON Lines files of BadCase/Audit/Feedback records (default: the embedded bus).")] = None,
        dry_run: Annotated[bool, typer.Option("--dry-run", help="Train and gate only; register nothing.")] = False,
        data_dir: DataDir = None,
        as_json: AsJson = False,
    ) -> None:
        """Run one retraining job by hand (data set, LoRA training, gate, registry).

        A trigger key that already has a job starts nothing; a crashed job for it is resumed.
        """
        import msgspec

        from entroloop.contract.records import RetrainRequest

        settings = _settings(data_dir)
        try:
            retrain = msgspec.json.decode(request.read_bytes(), type=RetrainRequest)
        except msgspec.ValidationError as exc:
            console.print(f"[red]{request}: not a RetrainRequest: {exc}[/red]")
            raise typer.Exit(2) from None
        runner = _runner(settings, records, dry_run)
        job = runner.submit(retrain)
        if job is None:
            existing = runner.store.get(retrain.trigger_key)
            if existing is not None and not existing.terminal and not existing.is_locked():
                console.print("a crashed job exists for this trigger key: resuming it")
                runner.run(existing)
            job = existing
            console.print(f"trigger key {retrain.trigger_key!r} already has a job; no second job started")
        if job is not None:
            _print_job(job, as_json)

    @app.command()
    def trainer(
        once: Annotated[bool, typer.Option("--once", help="Process what is there, then exit.")] = False,
        poll_seconds: Annotated[float, typer.Option(help="Wait between polls of the bus (embedded mode).")] = 5.0,
        broker: Broker = None,
        topic_prefix: TopicPrefix = None,
        session_timeout_s: Annotated[float, typer.Option(
            min=6, help="Kafka session timeout: how soon a dead trainer's partitions move to another.")] = 30.0,
        data_dir: DataDir = None,
        as_json: Annotated[bool, typer.Option("--json", help="Jobs (and, from Kafka, the final counters) as JSON lines.")] = False,
    ) -> None:
        """Consume retrain requests: resume crashed jobs, then one job per new trigger key.

        From Kafka when ENTROLOOP_KAFKA_BOOTSTRAP or --broker is set, else from the embedded bus.
        """
        settings = settings_or_exit(data_dir=data_dir, topic_prefix=topic_prefix,
                                    kafka_bootstrap=broker_address(broker) if broker else None)
        from entroloop.infra.metrics import serve_metrics

        serve_metrics(settings.metrics_port)
        if settings.kafka_bootstrap:
            stats = run_kafka_trainer(settings, _runner(settings, None, dry_run=False), once, session_timeout_s)
            if as_json:
                print_json(stats)
            else:
                console.print("trainer: " + " ".join(f"{k}={v}" for k, v in stats.items()))
            return
        _consume_bus(settings, once, poll_seconds, as_json)

    adapters = typer.Typer(help="The adapter registry: list, show, roll back.", no_args_is_help=True)
    app.add_typer(adapters, name="adapters")

    @adapters.command("list")
    def adapters_list(
        model: Annotated[str | None, typer.Option(help="Only adapters of this model.")] = None,
        as_json: Annotated[bool, typer.Option("--json", help="One JSON object per adapter, one per line.")] = False,
        data_dir: DataDir = None,
    ) -> None:
        """Registered adapters with their current status."""
        settings = _settings(data_dir)
        embedded_store_or_exit(settings)
        registry = _registry(settings, _actions(settings))
        rows = registry.list(model)
        if as_json:
            for row in rows:
                print(json.dumps(row, default=str))
            return
        table = Table("adapter", "registered", "model", "status", "parent", "trigger key")
        table.columns[0].no_wrap = True
        for row in rows:
            table.add_row(row["adapter_id"], str(row["registered_at"])[:19], row["model"], row["status"] or "",
                          row["parent_adapter"], row["trigger_key"])
        out.print(table)

    @adapters.command("show")
    def adapters_show(adapter_id: str, data_dir: DataDir = None, as_json: AsJson = False) -> None:
        """An adapter's manifest (file digests, base model and data set digests, metrics) and history."""
        settings = _settings(data_dir)
        embedded_store_or_exit(settings)
        registry = _registry(settings, _actions(settings))
        try:
            manifest = registry.manifest(adapter_id)
        except FileNotFoundError:
            console.print(f"[red]no adapter {adapter_id!r}[/red]")
            raise typer.Exit(2) from None
        payload = json.loads(manifest.to_bytes())
        payload["history"] = [
            {"at": str(at), "status": status, "share": share, "detail": detail}
            for at, status, share, detail in registry.history(adapter_id)
        ]
        if as_json:
            print_json(payload)
        else:
            out.print_json(json.dumps(payload, default=str))

    @adapters.command("rollback")
    def adapters_rollback(
        adapter_id: str,
        reason: Annotated[str, typer.Option(help="Why (goes into the action record).")] = "manual rollback",
        data_dir: DataDir = None,
        as_json: AsJson = False,
    ) -> None:
        """Route the adapter's traffic back (to its parent if it superseded one, else to the base model),
        unload it from every vLLM server (ENTROLOOP_VLLM_SERVERS) and mark it rolled back."""
        settings = _settings(data_dir)
        embedded_store_or_exit(settings)
        actions = _actions(settings)
        registry = _registry(settings, actions)
        if registry.status(adapter_id) is None:
            console.print(f"[red]no adapter {adapter_id!r}[/red]")
            raise typer.Exit(2)
        now_serving = rollback_adapter(settings, registry, actions, adapter_id, reason)
        if as_json:
            print_json({"adapter_id": adapter_id, "rolled_back": True, "now_serving": now_serving})
        else:
            console.print(f"{adapter_id}: rolled back; now serving {now_serving}")
