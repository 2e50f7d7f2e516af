"""What every command shares: settings that fail as one readable message, not a stack trace."""

from __future__ import annotations

from typing import Any

import typer
from rich.console import Console

from entroloop.contract.settings import Settings, SettingsError, load_settings

console = Console(stderr=True)


def settings_or_exit(**overrides: Any) -> Settings:
    """Settings from the environment plus the command's options (``None`` = not given); a wrong
    value names the variable and exits 2."""
    try:
        return load_settings(**{k: v for k, v in overrides.items() if v is not None})
    except SettingsError as exc:
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None


def embedded_store_or_exit(settings: Settings, create: bool = False) -> None:
    """Stop with one line (exit 2) when the settings point at an embedded chDB folder that does not
    exist: a mistyped --data-dir must not leave a fresh empty store behind and report 'nothing'.

    ``create=True`` (a command that sets up a new store on purpose) lets it be made. A server DSN is
    the server's business: nothing to check here.
    """
    from pathlib import Path

    dsn = settings.resolved_clickhouse_dsn()
    if create or not dsn.startswith("chdb://"):
        return
    if not (Path(dsn.removeprefix("chdb://")) / "metadata").exists():
        console.print(
            f"[red]{settings.data_dir} holds no embedded ClickHouse.[/red] Check --data-dir / ENTROLOOP_DATA_DIR, "
            f"or run `entroloop demo --data-dir {settings.data_dir}` first.",
            soft_wrap=True,
        )
        raise typer.Exit(2)


def print_json(payload: Any) -> None:
    """One JSON object on stdout as the last line: what `--json` promises scripts."""
    import json

    print(json.dumps(payload, default=str, ensure_ascii=False))


def broker_problem(bootstrap: str, timeout: float = 5.0) -> str | None:
    """None if the Kafka broker at ``bootstrap`` answers a metadata request, else why not in one line.

    The client's own connection log is silenced (``log_level`` 0): a dead broker is reported once,
    here, not as hundreds of retry lines.
    """
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    try:
        AdminClient({"bootstrap.servers": bootstrap, "log_level": 0}).list_topics(timeout=timeout)
    except KafkaException as exc:
        error = exc.args[0]
        return getattr(error, "str", lambda: str(error))()
    return None
