"""Reliability suite: every test is marked ``reliability``; the figures of every scenario are
printed again, together, at the end of the run (pytest hides a passing test's own output)."""

from __future__ import annotations

import pytest

from tests.integration.conftest import kafka_bootstrap, topic_prefix  # noqa: F401 - shared fixtures
from tests.reliability.harness import RESULTS


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/reliability/" in str(item.fspath):
            item.add_marker(pytest.mark.reliability)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # noqa: ARG001
    if not RESULTS:
        return
    terminalreporter.section("reliability figures")
    for figures in RESULTS:
        terminalreporter.write_line(figures.line())
