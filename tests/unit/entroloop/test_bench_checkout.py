"""A baseline checkout in `bench lag` runs its own stage code, not this environment's.

The stages install as ``entroloop.<stage>`` through the editable install, which maps them to this
repository: started inside another checkout, ``entroloop.sinks`` would silently be the current one.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from entroloop.benchmarks.checkout import REPO_ROOT, runnable_root

PROBE = "import entroloop.sinks.baseline_marker as m; print(m.WHERE)"


def _baseline_checkout(root: Path) -> Path:
    (root / "entroloop").mkdir(parents=True)
    (root / "entroloop" / "__init__.py").write_text("")
    (root / "sinks").mkdir()
    (root / "sinks" / "__init__.py").write_text("")
    (root / "sinks" / "baseline_marker.py").write_text("WHERE = 'the baseline checkout'\n")
    (root / "pyproject.toml").write_text('[tool.setuptools.package-dir]\n"entroloop.sinks" = "sinks"\n')
    return root


def _probe(cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", PROBE], cwd=cwd, capture_output=True, text=True, timeout=60,
                          check=False)


def test_a_namespace_layout_checkout_runs_its_own_stages(tmp_path: Path) -> None:
    checkout = _baseline_checkout(tmp_path / "baseline")
    in_place = _probe(checkout)
    assert in_place.returncode != 0, "started in place, the stages come from this environment's install"
    laid_out = _probe(runnable_root(checkout, tmp_path / "scratch"))
    assert laid_out.returncode == 0, laid_out.stderr[-2000:]
    assert laid_out.stdout.strip() == "the baseline checkout"


def test_an_old_layout_checkout_and_this_repository_run_in_place(tmp_path: Path) -> None:
    old = tmp_path / "old"
    (old / "sinks").mkdir(parents=True)
    (old / "pyproject.toml").write_text('[project]\nname = "entroloop"\n')
    assert runnable_root(old, tmp_path / "scratch") == old
    assert runnable_root(REPO_ROOT, tmp_path / "scratch") == REPO_ROOT
