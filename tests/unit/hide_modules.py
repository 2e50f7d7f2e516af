"""Run Python as if some installed packages were not installed: the check behind the slim install.

``python tests/unit/hide_modules.py HIDDEN OWN_ROOTS import TARGET...`` imports each TARGET
(``package.module`` or an entry-point value ``package.module:attr``) with the top-level modules in
HIDDEN (comma-separated) hidden, and prints one JSON object: the targets that failed (with their
traceback) and every attempt to import a hidden module, split into those made by code under
OWN_ROOTS (comma-separated package folders, whose parents go first on sys.path: this project's,
which must make none, even a caught one) and
those of third-party code (e.g. torch probing whether pandas exists, which a slim install allows).

``... HIDDEN OWN_ROOTS cli ARG...`` runs ``entroloop ARG...`` the same way (exit status and output
as they are).

A hidden module behaves as an absent one: ``importlib.util.find_spec`` answers None and ``import``
raises ModuleNotFoundError, because the finder that searches sys.path is replaced by one that does
not see them (the packages stay installed in the test environment).
"""

from __future__ import annotations

import importlib
import importlib.machinery
import json
import sys
import traceback
from pathlib import Path


def install(hidden: set[str], own_roots: list[Path]) -> dict[str, list[str]]:
    attempts: dict[str, list[str]] = {"own": [], "third_party": []}
    roots = [str(root.resolve()) for root in own_roots]
    loaded = sorted(name for name in sys.modules if name.partition(".")[0] in hidden)
    assert not loaded, f"already imported before the guard: {loaded}"

    def record(name: str) -> None:
        # the innermost frame outside importlib (and this file) is the importer
        for frame in reversed(traceback.extract_stack()[:-2]):
            if "importlib" in frame.filename or frame.filename.startswith("<frozen") or frame.filename == __file__:
                continue
            where = f"{name} from {frame.filename}:{frame.lineno}"
            mine = any(frame.filename.startswith(root) for root in roots)
            attempts["own" if mine else "third_party"].append(where)
            return
        attempts["third_party"].append(f"{name} from <unknown>")

    class HidingPathFinder(importlib.machinery.PathFinder):
        @classmethod
        def find_spec(cls, fullname, path=None, target=None):  # type: ignore[override]
            if fullname.partition(".")[0] in hidden:
                record(fullname)
                return None
            return importlib.machinery.PathFinder.find_spec(fullname, path, target)

    sys.meta_path[:] = [HidingPathFinder if f is importlib.machinery.PathFinder else f for f in sys.meta_path]
    assert HidingPathFinder in sys.meta_path, "no PathFinder on sys.meta_path to replace"
    return attempts


def import_targets(targets: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """(target -> traceback of its failure, target -> file it was imported from)."""
    errors, files = {}, {}
    for target in targets:
        module, _, attr = target.partition(":")
        try:
            loaded = importlib.import_module(module)
            if attr:
                getattr(loaded, attr)
            files[target] = str(getattr(loaded, "__file__", ""))
        except BaseException:  # noqa: BLE001 - reported, whatever it is
            errors[target] = traceback.format_exc(limit=-8)
    return errors, files


def main() -> None:
    hidden = set(filter(None, sys.argv[1].split(",")))
    own_roots = [Path(p) for p in sys.argv[2].split(",") if p]
    mode, args = sys.argv[3], sys.argv[4:]
    # the checkout under test (the folders holding the own packages), not an installed copy
    for folder in dict.fromkeys(str(root.resolve().parent) for root in reversed(own_roots)):
        sys.path.insert(0, folder)
    attempts = install(hidden, own_roots)
    if mode == "import":
        errors, files = import_targets(args)
        print(json.dumps({"errors": errors, "files": files, "attempts": attempts}))
    elif mode == "cli":
        sys.argv = ["entroloop", *args]
        from entroloop.cli import main as cli_main

        cli_main()
    else:
        raise SystemExit(f"unknown mode {mode!r}: import or cli")


if __name__ == "__main__":
    main()
