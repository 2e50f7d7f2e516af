"""The ``entroloop`` command line: one Typer app; each area registers its commands from its own module.

To add commands, write ``entroloop/cli/<area>.py`` with ``def register(app: typer.Typer) -> None``
and add the module name to ``COMMAND_MODULES``.
"""

from __future__ import annotations

import importlib
import sys

import typer

from entroloop.cli.extras import (
    extra_for,
    missing_extra_message,
    unavailable_commands_message,
)

app = typer.Typer(
    name="entroloop",
    help="Feedback and observability pipeline for self-hosted LLM serving.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,
)

COMMAND_MODULES = [
    "settings_command",
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


# Command modules that cannot be imported for want of an optional extra (a slim serving install has
# no `store`): left out, so the rest of the CLI works; asking for one of their commands says what to install.
UNAVAILABLE: dict[str, ModuleNotFoundError] = {}

for _name in COMMAND_MODULES:
    try:
        _module = importlib.import_module(f"entroloop.cli.{_name}")
    except ModuleNotFoundError as _exc:
        if extra_for(_exc) is None:
            raise
        UNAVAILABLE[_name] = _exc
        continue
    _module.register(app)


def _command_word(argv: list[str]) -> str:
    return next((word for word in argv if not word.startswith("-")), "")


def main() -> None:
    argv = sys.argv[1:]
    word = _command_word(argv)
    if UNAVAILABLE and word:
        known = typer.main.get_command(app)
        if word not in known.list_commands(known.context_class(known)):  # type: ignore[attr-defined]
            print(unavailable_commands_message(word, UNAVAILABLE), file=sys.stderr)
            raise SystemExit(2)
    try:
        app()
    except ModuleNotFoundError as exc:  # a command's own lazy import of an extra that is not installed
        words = []
        for w in argv:  # the command's words, up to its first option
            if w.startswith("-"):
                break
            words.append(w)
        message = missing_extra_message(exc, " ".join(words))
        if message is None:
            raise
        print(message, file=sys.stderr)
        raise SystemExit(2) from None


__all__ = ["app", "main"]
