"""stop_watchdog: a worker whose stop hangs exits with code 70 after the grace period; one that
stops in time keeps its own exit code."""

from __future__ import annotations

import logging
import subprocess
import sys
import threading

import pytest
from entroloop.streams.stop_watchdog import EXIT_STOP_HUNG, arm_stop_watchdog


def test_the_watchdog_exits_with_70_and_says_why(caplog: pytest.LogCaptureFixture) -> None:
    exited = threading.Event()
    codes: list[int] = []

    def exit_process(code: int) -> None:
        codes.append(code)
        exited.set()

    with caplog.at_level(logging.CRITICAL, logger="entroloop.streams.stop_watchdog"):
        arm_stop_watchdog(0.05, lambda: "KeyError('x')", exit_process)
        assert exited.wait(5)
    assert codes == [EXIT_STOP_HUNG] == [70]
    assert "did not stop within 0.05 s after KeyError('x')" in caplog.text


def _run(body: str) -> subprocess.CompletedProcess[str]:
    code = ("import time\nfrom entroloop.streams.stop_watchdog import arm_stop_watchdog\n"
            "arm_stop_watchdog(0.5, lambda: 'a stop request')\n" + body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_a_hung_process_is_ended_with_70() -> None:
    result = _run("time.sleep(30)\n")  # a stop that never ends
    assert result.returncode == EXIT_STOP_HUNG, result.stderr


def test_a_process_that_stops_in_time_keeps_its_exit_code() -> None:
    assert _run("raise SystemExit(3)\n").returncode == 3
    assert _run("pass\n").returncode == 0
