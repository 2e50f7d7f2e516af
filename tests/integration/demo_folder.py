"""A demo data folder shared by the operator-view tests (dashboards, report), built once per session.

The demo runs in a subprocess because chDB opens one data folder per process and the test session
may own another (``chdb_dsn``). Test modules import ``demo_data_dir``; the folder is cached at
module level so importing the fixture into several modules still runs the demo once.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
DEMO_REQUESTS = 800
_built: dict[str, tuple[Path, dict[str, Any]]] = {}


def run_module(module: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    """``python -m module args`` from the repository root, failing the test with its stderr."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout
    )
    if proc.returncode != 0:
        pytest.fail(f"python -m {module} {' '.join(args)} exited {proc.returncode}:\n{proc.stderr[-4000:]}", pytrace=False)
    return proc


@pytest.fixture(scope="session")
def demo_data_dir(tmp_path_factory) -> tuple[Path, dict[str, Any]]:
    """(folder, summary) of ``entroloop demo --requests 800`` run in a subprocess."""
    if "demo" not in _built:
        folder = tmp_path_factory.mktemp("operator-demo")
        proc = run_module("entroloop.cli", "demo", "--requests", str(DEMO_REQUESTS), "--data-dir", str(folder), "--reset", "--json")
        summary = json.loads(proc.stdout.strip().splitlines()[-1])
        _built["demo"] = (folder, summary)
    return _built["demo"]
