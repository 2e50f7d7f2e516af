"""``entroloop settings``: the effective configuration, in its own module so that a slim serving
install (no `store` extra, hence no ``embedded`` commands) can still check what a node will use."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from entroloop.cli.common import print_json, settings_or_exit
from entroloop.contract.settings import settings_markdown

out = Console()


def register(app: typer.Typer) -> None:
    @app.command("settings")
    def show_settings(
        markdown: Annotated[bool, typer.Option("--markdown", help="The documentation table of every variable.")] = False,
        as_json: Annotated[bool, typer.Option("--json", help="The effective settings as one JSON object (secrets masked).")] = False,
    ) -> None:
        """Show the effective settings (secrets masked), or document every variable."""
        if markdown:
            print(settings_markdown())
            return
        current = settings_or_exit(data_dir=None)
        if as_json:
            print_json({f"ENTROLOOP_{name.upper()}": value for name, value in current.model_dump(mode="json").items()})
            return
        for name, value in current.model_dump().items():
            out.print(f"ENTROLOOP_{name.upper()}={value}")
