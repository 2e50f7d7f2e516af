"""Small JSONL input files for the `entroloop eval` command tests, and the CLI runner they share."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner, Result

from entroloop.cli import app

# A fixed key, so redaction (pii, corrections) gives the same pseudonyms in every run.
EVAL_ENV = {"ENTROLOOP_PII_HASH_KEY": "eval-test-key-0123456789"}
_runner = CliRunner()


def write_lines(path: Path, lines: list[object]) -> Path:
    """One line per item: a string as it is (bad lines on purpose), anything else as JSON."""
    path.write_text("\n".join(x if isinstance(x, str) else json.dumps(x, ensure_ascii=False) for x in lines) + "\n",
                    encoding="utf-8")
    return path


def run_eval(command: str, *args: str, env: dict[str, str] | None = None) -> Result:
    """``entroloop eval COMMAND ARGS`` in-process, with ``EVAL_ENV`` and ``env`` on top of the environment."""
    return _runner.invoke(app, ["eval", command, *args], env={**EVAL_ENV, **(env or {})})


__all__ = ["EVAL_ENV", "run_eval", "write_lines"]
