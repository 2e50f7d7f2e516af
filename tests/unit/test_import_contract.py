"""The house rule, checked: import-linter's contract in pyproject.toml holds, every module of
``entroloop/`` sits in one of its layers, and the contract does break when a stage imports another.
"""

from __future__ import annotations

import os
import pkgutil
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import entroloop

ROOT = Path(__file__).resolve().parents[2]
STAGES = ("collectors", "streams", "sinks", "training")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _layers() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = [c for c in config["contracts"] if c["id"] == "layers"]
    return contract["layers"]


def _lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_the_import_contract_is_kept() -> None:
    result = _lint(ROOT)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_every_entroloop_module_is_in_a_layer() -> None:
    """A new module of entroloop/ must be placed in the contract, or it would escape it."""
    layered = {m.strip() for layer in _layers() for m in layer.replace("|", ":").split(":")}
    modules = {f"entroloop.{m.name}" for m in pkgutil.iter_modules(entroloop.__path__)}
    assert modules - layered == set(), "add these to [tool.importlinter] layers in pyproject.toml"
    assert set(STAGES) <= layered


def test_a_stage_importing_another_stage_breaks_the_contract(tmp_path: Path) -> None:
    """The contract can fail: a copy of the tree where streams imports sinks is reported broken."""
    for package in ("entroloop", *STAGES):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    base = tmp_path / "streams" / "base.py"
    base.write_text(base.read_text() + "\nimport sinks.kafka_sink  # noqa: E402,F401\n")
    result = _lint(tmp_path)
    assert result.returncode != 0
    assert "streams.base -> sinks.kafka_sink" in result.stdout, result.stdout[-3000:]
