"""The house rule, checked: import-linter's contract in pyproject.toml holds, every module of
``entroloop/`` sits in one of its layers, and the contract does break when a stage imports another.

The stages live in top-level folders of the repository but install as ``entroloop.<stage>``
(``[tool.setuptools.package-dir]``); import-linter reads packages from the file system, so the
contract is checked on a copy of the tree laid out as the wheel installs it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _layers() -> list[str]:
    (contract,) = [c for c in _pyproject()["tool"]["importlinter"]["contracts"] if c["id"] == "layers"]
    return contract["layers"]


def _installed_layout(target: Path) -> Path:
    """entroloop/ with each stage folder copied in as the subpackage the wheel installs it as."""
    ignore = shutil.ignore_patterns("__pycache__")
    shutil.copytree(ROOT / "entroloop", target / "entroloop", ignore=ignore)
    for package, folder in _pyproject()["tool"]["setuptools"]["package-dir"].items():
        shutil.copytree(ROOT / folder, target.joinpath(*package.split(".")), ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", target / "pyproject.toml")
    return target


def _lint(cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(cwd)}
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def test_the_import_contract_is_kept(tmp_path: Path) -> None:
    result = _lint(_installed_layout(tmp_path))
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_every_entroloop_module_is_in_a_layer(tmp_path: Path) -> None:
    """A new module of entroloop/ (or a new stage) must be placed in the contract, or it would escape it."""
    layered = {m.strip() for layer in _layers() for m in layer.replace("|", ":").split(":")}
    tree = _installed_layout(tmp_path) / "entroloop"
    modules = {f"entroloop.{p.stem}" for p in tree.glob("*.py") if p.stem != "__init__"}
    modules |= {f"entroloop.{p.parent.name}" for p in tree.glob("*/__init__.py")}
    assert modules - layered == set(), "add these to [tool.importlinter] layers in pyproject.toml"
    assert {"entroloop.collectors", "entroloop.streams", "entroloop.sinks", "entroloop.training"} <= modules


def test_a_stage_importing_another_stage_breaks_the_contract(tmp_path: Path) -> None:
    """The contract can fail: a copy of the tree where streams imports sinks is reported broken."""
    _installed_layout(tmp_path)
    base = tmp_path / "entroloop" / "streams" / "base.py"
    base.write_text(base.read_text() + "\nimport entroloop.sinks.kafka_sink  # noqa: E402,F401\n")
    result = _lint(tmp_path)
    assert result.returncode != 0
    assert "entroloop.streams.base -> entroloop.sinks.kafka_sink" in result.stdout, result.stdout[-3000:]
