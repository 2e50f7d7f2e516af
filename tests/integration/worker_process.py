"""One helper for the tests' worker subprocesses: ``python -m MODULE ARGS`` from the repository
root, its output in a log file under the test's tmp dir, stopped by a signal.

Used by the Faust worker tests (``streams_worker_main``, ``bad_case_worker_main``, ``entroloop.cli
worker``) so that each test only says which module, which arguments and which environment.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.integration.conftest import REPO_ROOT


class WorkerProcess:
    """A running worker subprocess and its log file."""

    def __init__(self, tmp: Path, module: str, *args: str, env: dict[str, str] | None = None,
                 name: str = "worker") -> None:
        self.log_path = tmp / f"{name}-{time.monotonic_ns()}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115 - the child writes to it until it stops
        child_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
        self.proc = subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO_ROOT, env=child_env,
                                     stdout=self._log, stderr=subprocess.STDOUT)

    def poll(self) -> int | None:
        return self.proc.poll()

    def send_signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int:
        code = self.proc.wait(timeout=timeout)
        self._log.close()
        return code

    def kill(self, sig: int = signal.SIGKILL, timeout: float = 90) -> None:
        """Send ``sig`` (SIGKILL by default) unless it has exited, wait for it, close the log."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        self.proc.wait(timeout=timeout)
        self._log.close()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_text()[-chars:]


__all__ = ["WorkerProcess"]
