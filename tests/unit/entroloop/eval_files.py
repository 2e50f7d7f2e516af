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


def entropy_figures(path: Path, with_ids: bool, tmp_path: Path, env: dict[str, str] | None = None,
                    drop: tuple[str, ...] = ()) -> dict:
    """``eval entropy --json`` on ``path``; without ids (token ids and surprisals dropped) and without
    the keys in ``drop``: the line as a sender without them would have it."""
    drop = drop if with_ids else ("token_ids", "surprisal", *drop)
    if drop:
        stripped = tmp_path / f"{path.stem}-without-{'-'.join(drop)}.jsonl"
        with path.open() as src, stripped.open("w") as dst:
            for line in src:
                row = json.loads(line)
                for key in drop:
                    row.pop(key, None)
                dst.write(json.dumps(row) + "\n")
        path = stripped
    result = run_eval("entropy", str(path), "--json", env=env)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout.strip().splitlines()[-1])


__all__ = ["EVAL_ENV", "entropy_figures", "run_eval", "write_lines"]
