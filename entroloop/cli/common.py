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
