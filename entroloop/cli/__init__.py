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
    "bench_workers",
    "gateway",
    "eval",
    "eval_intent",
    "actions",
]



def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"entroloop {version('entroloop')}")
        except PackageNotFoundError:  # run from a source tree that was never installed
            print("entroloop (not installed: no version)")
        raise typer.Exit()


@app.callback()
def _root(
    show_version: bool = typer.Option(False, "--version", callback=_print_version, is_eager=True,
                                      help="Print the installed version and exit."),
) -> None:
    """Feedback and observability pipeline for self-hosted LLM serving."""


for _name in COMMAND_MODULES:
    importlib.import_module(f"entroloop.cli.{_name}").register(app)


def main() -> None:
    app()


__all__ = ["app", "main"]
