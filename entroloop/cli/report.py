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
        since: Annotated[
            str | None, typer.Option("--since", help="Start of the window: ISO 8601 (2026-12-01T09:00:00Z; no zone = UTC) "
                                     "or a duration before now (90s, 30m, 24h, 7d, 2w). Default: the first stored event.")
        ] = None,
        until: Annotated[
            str | None, typer.Option("--until", help="End of the window (excluded), same forms as --since. Default: now.")
        ] = None,
        title: Annotated[str, typer.Option(help="Title of the page.")] = "entroloop operator report",
        as_json: Annotated[bool, typer.Option(
            "--json", help="End with one JSON line: the report's path, the window asked for (since, until) and the "
            "requests found in it (start, end), in unix seconds (null: open, or none), and rows per table.")] = False,
    ) -> None:
        """Write a self-contained HTML page: entropy over time and its distribution, anomalies, fallbacks, latency by stage, bad cases with their diffs, alerts, adapters.

        Reads the embedded ClickHouse of DATA_DIR (or ENTROLOOP_CLICKHOUSE_DSN). Every section covers the window given by --since and --until (default: everything stored). The page needs nothing else: no Grafana, no network.
        """
        from entroloop.infra.clickhouse.client import connect
        from entroloop.report import (
            EntropyThresholds,
            ReportWindow,
            WindowError,
            load_report_data,
            render_page,
        )

        try:
            window = ReportWindow.parse(since, until)
        except WindowError as exc:
            console.print(str(exc), style="red", soft_wrap=True, highlight=False, markup=False)
            raise typer.Exit(2) from None
        settings = settings_or_exit(data_dir=data_dir)
        embedded_store_or_exit(settings)
        dsn = settings.resolved_clickhouse_dsn()
        try:
            client = connect(dsn, settings.clickhouse_password.get_secret_value())
            data = load_report_data(client, settings.clickhouse_database, window,
                                    negative_rating=settings.badcase_negative_rating)
        except ClickHouseLocked as exc:
            console.print(f"[red]{exc}[/red]")
            raise typer.Exit(3) from None
        out.parent.mkdir(parents=True, exist_ok=True)
        thresholds = EntropyThresholds(settings.loop_threshold_nats, settings.gibberish_threshold_nats)
        out.write_text(render_page(data, title, thresholds), encoding="utf-8")
        if as_json:
            print_json({"report": str(out.resolve()), "since": window.since, "until": window.until,
                        "start": data.start, "end": data.end, "rows": data.table_rows})
        else:
            print(out.resolve())
