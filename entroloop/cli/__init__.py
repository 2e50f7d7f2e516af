"""The ``entroloop`` command line: one Typer app; each area registers its commands from its own module.

To add commands, write ``entroloop/cli/<area>.py`` with ``def register(app: typer.Typer) -> None``
and add the module name to ``COMMAND_MODULES``.
"""

from __future__ import annotations

import importlib

import typer

app = typer.Typer(
    name="entroloop",
    help="Feedback and observability pipeline for self-hosted LLM serving.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)

COMMAND_MODULES = [
    "embedded",
    "bench",
    "audit",
    "distributed",
    "report",
    "bench_sinks",
    "bench_collector",
    "sinks",
    "training",
    "bench_lag",
    "gateway",
    "eval",
    "eval_intent",
]

for _name in COMMAND_MODULES:
    importlib.import_module(f"entroloop.cli.{_name}").register(app)


def main() -> None:
    app()


__all__ = ["app", "main"]
