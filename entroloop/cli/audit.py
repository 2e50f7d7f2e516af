"""``entroloop audit``: verify the write-once audit log, and read records back by one narrow key:
audit records by audit id or user id, action records by action id or alert key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from entroloop.cli.common import settings_or_exit
from entroloop.contract.settings import Settings

console = Console(stderr=True)

audit_app = typer.Typer(
    name="audit",
    help="The WORM audit log: verify its tamper evidence; read audit records by audit id or user id, "
    "action records by action id or alert key.",
    no_args_is_help=True,
)

DataDir = Annotated[
    Path | None,
    typer.Option("--data-dir", "-d", help="Embedded data folder holding worm/ (default: ENTROLOOP_DATA_DIR)."),
]
Store = Annotated[
    str | None,
    typer.Option("--store", help="`local` or `s3` (default: ENTROLOOP_AUDIT_STORE; s3 uses ENTROLOOP_S3_*)."),
]


def _settings(data_dir: Path | None, store: str | None) -> Settings:
    overrides: dict[str, Any] = {}
    if data_dir:
        overrides["data_dir"] = data_dir
    if store:
        overrides["audit_store"] = store
    return settings_or_exit(**overrides)


def _store(settings: Settings):
    from entroloop.infra.worm.stores import local_store_path, open_worm_store

    if settings.audit_store == "local" and not local_store_path(settings).exists():
        console.print(f"[red]{local_store_path(settings)} holds no audit log[/red] (wrong --data-dir?)")
        raise typer.Exit(2)
    try:
        return open_worm_store(settings)
    except ValueError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None


def _storage_error(exc: Exception) -> None:
    """Say what went wrong with the store in one line (no stack trace) and exit 2."""
    console.print(f"[red]audit store error:[/red] {type(exc).__name__}: {exc}")
    raise typer.Exit(2) from None


def _is_storage_error(exc: Exception) -> bool:
    from entroloop.infra.worm.s3_store import S3Unavailable

    return isinstance(exc, (S3Unavailable, OSError)) or type(exc).__module__.startswith("botocore")


@audit_app.command()
def verify(
    data_dir: DataDir = None,
    store: Store = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as one JSON object.")] = False,
) -> None:
    """Recompute every hash, Merkle root and chain link; exit 1 naming each problem found."""
    from sinks.audit.verify import verify_store

    try:
        report = verify_store(_store(_settings(data_dir, store)))
    except Exception as exc:
        if not _is_storage_error(exc):
            raise
        _storage_error(exc)
    if as_json:
        print(json.dumps(report.as_dict()))
    else:
        for problem in report.problems:
            console.print(f"[red]{problem.kind}[/red] {problem.key}: {problem.detail}")
        verdict = "[green]intact[/green]" if report.ok else f"[red]{len(report.problems)} problem(s)[/red]"
        per_topic = ", ".join(f"{topic}: {n}" for topic, n in sorted(report.records_by_topic.items()))
        console.print(
            f"{report.store}: {verdict} — {report.chains} chains, {report.batches} batches, {report.files} files, "
            f"{report.records} records{f' ({per_topic})' if per_topic else ''}, "
            f"{report.bytes / 1e6:.1f} MB in {report.seconds:.2f}s"
        )
    if not report.ok:
        raise typer.Exit(1)


def _print_lookup(settings: Settings, topic: str, column: str, value: str, what: str) -> None:
    """Print the records of ``topic`` whose ``column`` equals ``value`` as JSON lines; exit 1 if none."""
    from entroloop.infra.worm.reader import find_records

    found = 0
    try:
        for record in find_records(_store(settings), column, value, topic=topic):
            print(json.dumps(record, ensure_ascii=False, default=str))
            found += 1
    except Exception as exc:
        if not _is_storage_error(exc):
            raise
        _storage_error(exc)
    if not found:
        console.print(f"no {what} with {column} = {value!r}")
        raise typer.Exit(1)


def _one_of(options: dict[str, str | None]) -> tuple[str, str]:
    """The (column, value) of the one option given; exit 2 unless exactly one was."""
    given = [(column, value) for column, value in options.items() if value is not None]
    if len(given) != 1:
        console.print(f"[red]give exactly one of {' or '.join('--' + c.replace('_', '-') for c in options)}[/red]")
        raise typer.Exit(2)
    return given[0]


@audit_app.command()
def get(
    audit_id: Annotated[str | None, typer.Option("--audit-id", help="The audit id of one answer.")] = None,
    user_id: Annotated[str | None, typer.Option("--user-id", help="Every record of one (pseudonymised) user id.")] = None,
    data_dir: DataDir = None,
    store: Store = None,
) -> None:
    """Print the audit records of one audit id or one user id as JSON lines (the only read paths)."""
    from entroloop.contract.records import Audit

    column, value = _one_of({"audit_id": audit_id, "user_id": user_id})
    _print_lookup(_settings(data_dir, store), Audit.topic, column, value, "audit record")


@audit_app.command()
def actions(
    action_id: Annotated[str | None, typer.Option("--action-id", help="The action id of one action record.")] = None,
    alert_key: Annotated[
        str | None,
        typer.Option("--alert-key", help="Every action about one alert key (retraining loop: trigger key or adapter id)."),
    ] = None,
    data_dir: DataDir = None,
    store: Store = None,
) -> None:
    """Print the action records of one action id or one alert key as JSON lines, read from the
    write-once log through its manifests (the only read paths for actions)."""
    from entroloop.contract.records import Action

    column, value = _one_of({"action_id": action_id, "alert_key": alert_key})
    _print_lookup(_settings(data_dir, store), Action.topic, column, value, "action record")


def register(app: typer.Typer) -> None:
    app.add_typer(audit_app, name="audit")
