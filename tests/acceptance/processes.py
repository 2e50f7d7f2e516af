"""Child processes of the acceptance stack: each runs with its log in a file, is waited for by its
own readiness check, and is always stopped (SIGTERM, then SIGKILL) by the fixture that started it.

The suite itself runs in .venv-ml (the official ``openai`` SDK comes with vLLM there, and the vLLM
server runs with ``sys.executable``); entroloop's Faust worker, sinks, action runner and report run
in the light env, whose interpreter ``light_python`` finds.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
LIGHT_PYTHON_VARIABLE = "ENTROLOOP_LIGHT_PYTHON"


def light_python() -> str:
    """The light env's interpreter (faust, chDB, pyarrow): ENTROLOOP_LIGHT_PYTHON, else REPO_ROOT/.venv."""
    path = Path(os.environ.get(LIGHT_PYTHON_VARIABLE) or REPO_ROOT / ".venv" / "bin" / "python")
    if not path.exists():
        pytest.fail(f"the light env's python {path} does not exist: build it (`make install`) or set "
                    f"{LIGHT_PYTHON_VARIABLE} to its interpreter", pytrace=False)
    return str(path)


class Child:
    """One running child process writing to ``log_path``."""

    def __init__(self, name: str, cmd: list[str], env: dict[str, str], logs: Path, cwd: Path = REPO_ROOT) -> None:
        self.name = name
        self.log_path = logs / f"{name}.log"
        with open(self.log_path, "ab") as log:
            # its own process group: vLLM forks an engine core, which must go down with it
            self.proc = subprocess.Popen(cmd, cwd=cwd, env={**env, "PYTHONUNBUFFERED": "1"}, stdout=log,
                                         stderr=subprocess.STDOUT, start_new_session=True)

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def wait_until(self, ready: Callable[[], bool], timeout_s: float, what: str) -> None:
        """Poll ``ready`` until it is true; fail with the log's tail if the process dies or time runs out."""
        deadline = time.monotonic() + timeout_s
        while not ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"{self.name} never became {what} (exit {self.proc.poll()}):\n{self.log_tail()}",
                            pytrace=False)
            time.sleep(0.5)

    def finish(self, timeout_s: float) -> int:
        """Wait for a command that ends on its own; fail with its log if it does not end in time."""
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.stop()
            pytest.fail(f"{self.name} did not finish within {timeout_s:.0f}s:\n{self.log_tail()}", pytrace=False)

    def stop(self, grace_s: float = 30.0) -> None:
        """SIGTERM the process group, SIGKILL it after ``grace_s``; safe to call twice."""
        if self.proc.poll() is None:
            _signal_group(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        _signal_group(self.proc.pid, signal.SIGKILL)  # children left behind by a clean exit, too
        if self.proc.poll() is None:
            self.proc.wait(timeout=30)


def _signal_group(pid: int, sig: int) -> None:
    try:
        os.killpg(pid, sig)
    except ProcessLookupError:
        pass


def run_cli(name: str, args: list[str], env: dict[str, str], logs: Path, timeout_s: float = 180.0) -> str:
    """Run ``entroloop ARGS`` in the light env to its end; its stdout (the log keeps stderr too)."""
    child = Child(name, [light_python(), "-m", "entroloop.cli", *args], env, logs)
    code = child.finish(timeout_s)
    if code != 0:
        pytest.fail(f"`entroloop {' '.join(args)}` exited with {code}:\n{child.log_tail()}", pytrace=False)
    return child.log_path.read_text(errors="replace")


def query(sql: str, env: dict[str, str], logs: Path) -> list[dict]:
    """Rows of a read-only query through `entroloop query --json` (the chDB folder of the env's DATA_DIR)."""
    out = subprocess.run([light_python(), "-m", "entroloop.cli", "query", "--json", sql], cwd=REPO_ROOT, env=env,
                         capture_output=True, text=True, timeout=120, check=False)
    with open(logs / "queries.log", "a") as log:
        log.write(f"$ {sql}\n{out.stdout}{out.stderr}\n")
    if out.returncode != 0:
        pytest.fail(f"`entroloop query` failed ({out.returncode}) on {sql}:\n{out.stderr[-2000:]}", pytrace=False)
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def http_ok(url: str, headers: dict[str, str] | None = None) -> Callable[[], bool]:
    def ready() -> bool:
        try:
            with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=2) as answer:
                return answer.status == 200
        except OSError:
            return False

    return ready
