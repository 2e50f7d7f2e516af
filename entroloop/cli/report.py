"""``entroloop report``: write the operator's HTML report (plots, tables) from the stored events."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from entroloop.cli.common import embedded_store_or_exit, print_json, settings_or_exit
from entroloop.infra.clickhouse.client import ClickHouseLocked

console = Console(stderr=True)


def register(app: typer.Typer) -> None:
    @app.command()
    def report(
        out: Annotated[Path, typer.Option("--out", "-o", help="HTML file to write.")] = Path("report.html"),
        data_dir: Annotated[
            Path | None, typer.Option("--data-dir", "-d", help="Embedded data folder (default: ENTROLOOP_DATA_DIR or ./.entroloop).")
        ] = None,
        title: Annotated[str, typer.Option(help="Title of the page.")] = "entroloop operator report",
        as_json: Annotated[bool, typer.Option("--json", help="End with {\"report\": path} as one JSON line.")] = False,
    ) -> None:
        """Write a self-contained HTML page with entropy, anomaly, fallback, latency and bad-case plots.

        Reads the embedded ClickHouse of DATA_DIR (or ENTROLOOP_CLICKHOUSE_DSN). The page needs nothing else: no Grafana, no network.
        """
        from entroloop.infra.clickhouse.client import connect
        from entroloop.report import load_report_data, render_page

        settings = settings_or_exit(data_dir=data_dir)
        embedded_store_or_exit(settings)
        dsn = settings.resolved_clickhouse_dsn()
        try:
            client = connect(dsn, settings.clickhouse_password.get_secret_value())
            data = load_report_data(client, settings.clickhouse_database)
        except ClickHouseLocked as exc:
            console.print(f"[red]{exc}[/red]")
            raise typer.Exit(3) from None
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(render_page(data, title), encoding="utf-8")
        if as_json:
            print_json({"report": str(out.resolve())})
        else:
            print(out.resolve())
