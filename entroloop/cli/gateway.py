"""`entroloop gateway`: the audit gateway (an OpenAI-compatible proxy) in front of an engine.

Settings come from ``ENTROLOOP_*`` (``ENTROLOOP_GATEWAY_*`` and the publisher's); options override
them. Records go to Kafka through the node publisher, or to a frame file in ``ENTROLOOP_DATA_DIR``
when no ``ENTROLOOP_KAFKA_BOOTSTRAP`` is set. Needs the ``gateway`` extra.
"""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from entroloop.cli.common import settings_or_exit
from entroloop.contract.settings import SettingsError
from entroloop.infra.pii import PII_KEY_FIX, PII_KEY_VARIABLE

console = Console(stderr=True)


def gateway(
    upstream: Annotated[str | None, typer.Option(help="Engine base URL (default ENTROLOOP_GATEWAY_UPSTREAM).")] = None,
    port: Annotated[int | None, typer.Option(help="Port to listen on (default ENTROLOOP_GATEWAY_PORT).")] = None,
    host: Annotated[str | None, typer.Option(help="Address to listen on (default ENTROLOOP_GATEWAY_HOST).")] = None,
    engine: Annotated[
        str | None, typer.Option(help="vllm, openai or auto (default ENTROLOOP_GATEWAY_ENGINE).")
    ] = None,
    adapter_routing: Annotated[
        bool | None,
        typer.Option(help="Route base-model requests to promoted/canary LoRA adapters as ClickHouse's "
                     "adapter_status says (default ENTROLOOP_GATEWAY_ADAPTER_ROUTING)."),
    ] = None,
    log_level: Annotated[str, typer.Option(help="uvicorn log level.")] = "info",
) -> None:
    """Serve the OpenAI API, forward it to UPSTREAM, publish PII-redacted Audit records and Spans."""
    settings = settings_or_exit()
    if engine is not None and engine not in ("vllm", "openai", "auto"):
        console.print(f"[red]--engine {engine!r}: expected vllm, openai or auto[/red]")
        raise typer.Exit(2)
    try:
        import uvicorn

        from entroloop.collectors.gateway.app import (
            GatewayConfigError,
            app_from_settings,
        )
    except ImportError as exc:
        console.print(f"[red]{exc}: install the gateway extra: pip install 'entroloop[gateway]'[/red]")
        raise typer.Exit(2) from None

    try:
        app = app_from_settings(settings, upstream=upstream, engine=engine, adapter_routing=adapter_routing)
    except (SettingsError, GatewayConfigError) as exc:  # e.g. production without a PII key; API keys
        # that cannot work (messages name the setting and the fix, never a key)
        console.print(f"[red]{exc}[/red]")
        raise typer.Exit(2) from None
    if app.state.gateway.redactor.ephemeral:
        console.print(f"[bold yellow]WARNING: {PII_KEY_VARIABLE} is not set (demo mode): PII pseudonyms use a "
                      f"random key of this process and will not join across processes or restarts; "
                      f"{PII_KEY_FIX}[/bold yellow]")
    listen_host = host or settings.gateway_host
    listen_port = port or settings.gateway_port
    config = app.state.gateway.config
    console.print(f"entroloop gateway on http://{listen_host}:{listen_port} -> {config.upstream}")
    if config.api_keys:
        console.print(f"API keys for {len(config.api_keys.tenants)} tenant(s); inference "
                      f"{'needs a key' if config.access_policy().inference_needs_key else 'is open'}; admin paths for "
                      f"{', '.join(sorted(config.admin_tenants)) or 'nobody'}")
    else:
        console.print("[yellow]no API key configured: inference is open to anyone who reaches this port and admin "
                      "paths are refused; set ENTROLOOP_GATEWAY_API_KEYS_FILE (tenant:key lines)[/yellow]")
    if config.fallback_upstream:
        console.print(f"fallback tier (POST /admin/routes/{config.route}/tier): {config.fallback_upstream}")
    routing = app.state.gateway.routing.inner  # the admin API's wrapper around the registry's routing table
    if routing is not None:
        console.print(f"adapter routing from {settings.clickhouse_database}.adapter_status, "
                      f"refreshed every {routing.refresh_s:g} s")
    uvicorn.run(app, host=listen_host, port=listen_port, log_level=log_level)


def register(app: typer.Typer) -> None:
    app.command("gateway")(gateway)
