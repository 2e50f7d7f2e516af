"""The slim serving install: what vLLM loads from entroloop imports nothing store-side.

``pip install 'entroloop[serving]'`` (alias ``[vllm]``) puts the entropy tap, the node publisher and
the OTel span exporter into the vLLM environment without chDB, pyarrow, pandas or the ClickHouse
client. Two checks keep it so:

* the two entry points vLLM loads (read from pyproject.toml), the publisher, the gateway and the
  event contract are imported in a subprocess in which those packages are hidden (they behave as
  not installed; ``hide_modules.py``). Any attempt of this project's code to import one fails the
  test, even one wrapped in ``try/except ImportError``; third-party probing is allowed;
* the dependency closure of the core requirements plus ``serving`` (from the installed
  distributions' metadata) holds none of them.

The guard itself is checked on a module that does import pyarrow. The vLLM entry point needs torch
and vLLM, so that case runs in the heavy suite (marker ``vllm``).
"""

from __future__ import annotations

import json
import pkgutil
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

import pytest

import entroloop.contract

ROOT = Path(__file__).resolve().parents[2]
GUARD = Path(__file__).with_name("hide_modules.py")
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
# what a serving node must not import (pandas comes with chDB) ...
STORE_MODULES = ("chdb", "pyarrow", "pandas", "clickhouse_connect")
# ... and, hidden in these checks too, the rest of the store extra (the serving path needs none of it)
STORE_EXTRA_MODULES = (*STORE_MODULES, "yaml", "ahocorasick", "jsonschema", "cryptography")
STORE_DISTRIBUTIONS = {"chdb", "pyarrow", "pandas", "clickhouse-connect"}
OWN_PACKAGES = ("entroloop", "collectors", "streams", "sinks", "training")


def entry_points(group: str) -> list[str]:
    return list(PYPROJECT["project"]["entry-points"][group].values())


def run_guard(targets: list[str], own_roots: list[Path], hidden: tuple[str, ...] = STORE_EXTRA_MODULES,
              timeout: float = 300) -> dict:
    result = subprocess.run(
        [sys.executable, str(GUARD), ",".join(hidden), ",".join(str(r) for r in own_roots), "import", *targets],
        cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    report["stderr"] = result.stderr
    return report


def own_roots() -> list[Path]:
    return [ROOT / package for package in OWN_PACKAGES]


def assert_slim(report: dict) -> None:
    assert not report["errors"], "\n\n".join(f"{t}:\n{tb}" for t, tb in report["errors"].items())
    elsewhere = {t: f for t, f in report["files"].items() if not f.startswith(str(ROOT))}
    assert not elsewhere, f"imported from outside the checkout under test: {elsewhere}"
    assert not report["attempts"]["own"], (
        "serving code imports store-side packages (move the import into the function that needs it, "
        f"or out of the serving path): {report['attempts']['own']}")


def contract_modules() -> list[str]:
    return [f"entroloop.contract.{m.name}" for m in pkgutil.iter_modules(entroloop.contract.__path__)]


def test_serving_modules_import_without_the_store_packages() -> None:
    targets = [
        *entry_points("vllm.general_plugins"),   # the span exporter vLLM loads in the API server
        "entroloop.collectors.publisher:Publisher",
        "entroloop.collectors.otel_exporter:SpanRecordExporter",
        "entroloop.collectors.vllm.emit:resolve_sink",
        "entroloop.collectors.gateway.app:app_from_settings",  # a gateway needs no store either (routing is lazy)
        "entroloop.collectors.feedback_client:FeedbackClient",
        "entroloop.contract",
        *contract_modules(),
    ]
    assert len(targets) > 8
    report = run_guard(targets, own_roots())
    assert_slim(report)


@pytest.mark.vllm
def test_the_vllm_entry_points_import_without_the_store_packages() -> None:
    """What vLLM loads in every engine core and in the API server, in the vLLM environment (.venv-ml)."""
    targets = [*entry_points("vllm.logits_processors"), *entry_points("vllm.general_plugins"), "entroloop.collectors.vllm.tap"]
    assert any("vllm_adapter" in t for t in targets)
    # only the four: vLLM's own dependencies bring PyYAML, jsonschema and cryptography anyway
    report = run_guard(targets, own_roots(), hidden=STORE_MODULES)
    assert_slim(report)
    # vLLM 0.32 is the tested release: the tap loads without the out-of-range warning
    assert "outside the supported range" not in report["stderr"]


def test_the_guard_fails_on_a_store_import(tmp_path: Path) -> None:
    package = tmp_path / "slimcheck"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "direct.py").write_text("import pyarrow  # noqa: F401\n")
    (package / "caught.py").write_text("try:\n    import pandas  # noqa: F401\nexcept ImportError:\n    pandas = None\n")
    (package / "clean.py").write_text("import json  # noqa: F401\n")
    report = run_guard(["slimcheck.direct", "slimcheck.caught", "slimcheck.clean"], [package])
    assert set(report["errors"]) == {"slimcheck.direct"}
    assert "No module named 'pyarrow'" in report["errors"]["slimcheck.direct"]
    own = report["attempts"]["own"]
    assert any(a.startswith("pyarrow from ") and a.endswith("direct.py:1") for a in own), own
    assert any(a.startswith("pandas from ") and "caught.py" in a for a in own), own  # caught, still refused
    with pytest.raises(AssertionError, match="slimcheck.direct"):
        assert_slim(report)


def _requirement_names(requirements: list[str], extras: set[str]) -> set[str]:
    from packaging.requirements import Requirement

    names = set()
    for raw in requirements:
        req = Requirement(raw)
        if req.marker is not None and not any(req.marker.evaluate({"extra": extra}) for extra in (extras or {""})):
            continue
        names.add(re.sub(r"[-_.]+", "-", req.name).lower())
    return names


def test_the_slim_install_pulls_no_store_distribution() -> None:
    project = PYPROJECT["project"]
    extras = project["optional-dependencies"]
    assert extras["vllm"] == ["entroloop[serving]"], "`vllm` stays an alias of `serving`"
    roots = _requirement_names(project["dependencies"], set()) | _requirement_names(extras["serving"], set())
    assert not roots & STORE_DISTRIBUTIONS
    assert {"chdb", "pyarrow", "clickhouse-connect"} <= _requirement_names(extras["store"], set())

    # everything the serving install would bring, as far as this environment has it installed
    seen, unexpanded, todo = set(), set(), sorted(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = metadata.distribution(name).requires or []
        except metadata.PackageNotFoundError:
            unexpanded.add(name)
            continue
        todo.extend(_requirement_names(requires, set()) - seen)
    assert not seen & STORE_DISTRIBUTIONS, f"the serving install pulls {sorted(seen & STORE_DISTRIBUTIONS)}"
    core = _requirement_names(project["dependencies"], set())
    assert not core & unexpanded, f"core dependencies not installed here: {sorted(core & unexpanded)}"
    assert len(seen) > 20


def test_every_full_install_adds_the_store_extra() -> None:
    makefile = (ROOT / "Makefile").read_text()
    line = next(l for l in makefile.splitlines() if "install -q -e '." in l)
    assert "store" in re.search(r"\[([^\]]+)\]", line).group(1).split(","), line
    ml = (ROOT / "scripts/install_ml_env.sh").read_text()
    assert "store" in re.search(r'^ENTROLOOP_EXTRAS="([^"]+)"', ml, re.M).group(1).split(",")
    assert re.search(r'pip install --no-cache-dir "\.\[store,\$\{EXTRAS\}\]"', (ROOT / "Dockerfile").read_text())
    serving = (ROOT / "Dockerfile.serving").read_text()
    assert "[serving]" in serving and "store" not in re.sub(r"#.*", "", serving)


def run_cli(args: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """`entroloop ARGS` in a slim install (the store packages hidden)."""
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("ENTROLOOP_")}
    env["ENTROLOOP_DATA_DIR"] = str(tmp_path / "data")
    return subprocess.run([sys.executable, str(GUARD), ",".join(STORE_EXTRA_MODULES),
                           ",".join(str(r) for r in own_roots()), "cli", *args],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False)


def test_a_command_without_its_extra_says_which_to_install(tmp_path: Path) -> None:
    """One line naming the extra, exit status 2, no traceback: for a command whose own import fails
    when it runs (trainer) and for one whose module could not be loaded at all (report)."""
    for args, expected in ((["trainer", "--once"], "entroloop trainer: needs the `store` extra"),
                           (["report", "--out", str(tmp_path / "r.html")], "entroloop report: not available in this install")):
        result = run_cli(args, tmp_path)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
        assert len(lines) == 1 and lines[0].startswith(expected), result.stderr
        assert lines[0].endswith("pip install 'entroloop[store]'")
        assert "Traceback" not in result.stdout + result.stderr
    # the rest of the CLI works in the slim install
    usage = run_cli(["--help"], tmp_path)
    assert usage.returncode == 0 and "gateway" in usage.stdout


def test_only_a_known_extra_is_named() -> None:
    from entroloop.cli.extras import missing_extra_message

    assert missing_extra_message(ModuleNotFoundError("No module named 'chdb'", name="chdb"), "query") == (
        "entroloop query: needs the `store` extra, not installed here (no module 'chdb'): pip install 'entroloop[store]'")
    assert "entroloop[kafka]" in missing_extra_message(ModuleNotFoundError("x", name="faust.app"), "worker")
    # a module no extra provides is a bug or a broken environment: left to raise as it is
    assert missing_extra_message(ModuleNotFoundError("x", name="streams.nonexistent"), "worker") is None
    assert missing_extra_message(ImportError("cannot import name 'x'", name="chdb"), "query") is None


def test_a_serving_node_can_check_its_settings_without_the_store(tmp_path: Path) -> None:
    """`entroloop settings` lives outside the embedded commands, so the slim install has it."""
    result = run_cli(["settings", "--json"], tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads(result.stdout.splitlines()[-1])["ENTROLOOP_DATA_DIR"] == str(tmp_path / "data")
