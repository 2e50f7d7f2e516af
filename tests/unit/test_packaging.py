"""The wheel installs everything under the ``entroloop`` namespace: the stage folders of the repository
(collectors/, streams/, sinks/, training/) become ``entroloop.collectors`` and so on, and no code imports
them by their folder names (which would load a second copy of a module when run from the repository).
"""

from __future__ import annotations

import ast
import os
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SETUPTOOLS = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
FOLDERS = {folder: package for package, folder in SETUPTOOLS["package-dir"].items()}
SKIP = {".git", ".venv", ".venv-ml", "node_modules", ".demo", ".services", "build", "dist"}


def _package_name(init: Path) -> str:
    parts = init.parent.relative_to(ROOT).parts
    return ".".join((FOLDERS.get(parts[0], parts[0]), *parts[1:]))


def test_every_package_folder_is_installed_under_the_namespace() -> None:
    found = {_package_name(init) for top in ("entroloop", *FOLDERS) for init in (ROOT / top).rglob("__init__.py")
             if "__pycache__" not in init.parts}
    assert found == set(SETUPTOOLS["packages"]), "keep [tool.setuptools] packages in pyproject.toml in step"
    assert all(name == "entroloop" or name.startswith("entroloop.") for name in SETUPTOOLS["packages"])


def _python_files() -> list[Path]:
    files: list[Path] = []
    for folder, dirs, names in os.walk(ROOT):
        # never enter the skipped folders: a running MinIO creates and removes folders under
        # .services/minio/data while rglob walks them (FileNotFoundError in a CI run)
        dirs[:] = [d for d in dirs if d not in SKIP]
        files += [Path(folder) / name for name in names if name.endswith(".py")]
    return files


def test_no_code_imports_a_stage_by_its_folder_name() -> None:
    offenders = []
    for path in _python_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) and node.level == 0 else [])
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in FOLDERS]
    assert offenders == [], "import these as entroloop.<stage>: " + ", ".join(offenders[:20])


def test_the_vllm_entry_points_name_the_namespace() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    targets = [t for group in project["entry-points"].values() for t in group.values()]
    assert targets and all(t.startswith("entroloop.") for t in targets)
