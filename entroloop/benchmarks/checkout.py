"""Where to start entroloop from another checkout (a baseline of ``bench lag``) so that it runs that
checkout's code.

The stage folders install under the entroloop namespace (``[tool.setuptools.package-dir]`` maps
``entroloop.sinks`` to ``sinks/``). ``python -m entroloop.cli`` started inside another checkout finds
that checkout's ``entroloop/`` but would resolve ``entroloop.sinks`` and the other stages through this
environment's editable install: the current code, silently measured as the baseline. Such a checkout
is run from a scratch folder laid out as the wheel installs it: a copy of its ``entroloop/`` with each
stage folder linked in. An older checkout (stages imported as top-level packages) runs in place.
"""

from __future__ import annotations

import shutil
import tomllib
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]


def runnable_root(checkout: Path, scratch: Path) -> Path:
    """The folder to start ``python -m entroloop.cli`` in (as its cwd) to run ``checkout``'s code."""
    if checkout.resolve() == REPO_ROOT:
        return REPO_ROOT  # this environment's install already maps the stages to this checkout
    pyproject = tomllib.loads((checkout / "pyproject.toml").read_text())
    mapping = pyproject.get("tool", {}).get("setuptools", {}).get("package-dir", {})
    if not mapping:
        return checkout
    root = scratch / "entroloop-layout"
    if root.exists():
        shutil.rmtree(root)
    shutil.copytree(checkout / "entroloop", root / "entroloop", ignore=shutil.ignore_patterns("__pycache__"))
    for package, folder in mapping.items():
        root.joinpath(*package.split(".")).symlink_to((checkout / folder).resolve(), target_is_directory=True)
    return root
