"""One command line: `--version`, `--log-level`, `--json` on every reporting command, read commands
that never create folders, and a dead broker reported in one line (issue 13 item 8)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib.metadata import version

import pytest
from typer.testing import CliRunner

from entroloop.cli import app

runner = CliRunner()


def _options(*command: str) -> str:
    result = runner.invoke(app, [*command, "--help"], env={"COLUMNS": "200", "TERM": "dumb", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    return result.output


def test_version_prints_the_installed_version():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.strip() == f"entroloop {version('entroloop')}"


@pytest.mark.parametrize("command", [("worker",), ("sink", "clickhouse"), ("sink", "audit"), ("gateway",)])
def test_every_long_running_command_spells_log_level_the_same(command):
    text = _options(*command)
    assert "--log-level" in text
    assert "--loglevel" not in text


@pytest.mark.parametrize("command", [
    ("migrate",), ("settings",), ("report",), ("train",), ("trainer",), ("adapters", "list"),
    ("adapters", "show"), ("adapters", "rollback"), ("query",), ("demo",), ("replay",), ("bench", "all"),
    ("actions",), ("eval", "intent"),
])
def test_every_reporting_command_has_json(command):
    assert "--json" in _options(*command)


@pytest.mark.parametrize("command", [
    ["query", "SELECT 1"], ["adapters", "list"], ["adapters", "show", "a1"], ["migrate"], ["report", "--out"],
])
def test_read_commands_refuse_a_missing_data_folder_and_create_nothing(tmp_path, command):
    missing = tmp_path / "typo"
    if command[-1] == "--out":
        command = [*command, str(tmp_path / "r.html")]
    result = runner.invoke(app, [*command, "--data-dir", str(missing)], env={"ENTROLOOP_CLICKHOUSE_DSN": ""})
    assert result.exit_code == 2, result.output
    assert "holds no embedded ClickHouse" in result.output
    assert not missing.exists()


def _entroloop(*args: str) -> subprocess.CompletedProcess:
    """The command in its own process: chDB opens one data folder per process, and this test
    session may already hold another."""
    return subprocess.run([sys.executable, "-m", "entroloop.cli", *args], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "ENTROLOOP_CLICKHOUSE_DSN": ""})


def test_migrate_json_and_create_make_a_new_store(tmp_path):
    folder = tmp_path / "new"
    first = _entroloop("migrate", "--create", "--json", "--data-dir", str(folder))
    assert first.returncode == 0, first.stderr
    applied = json.loads(first.stdout.strip().splitlines()[-1])["applied"]
    assert applied and applied[0].startswith("0001_")
    again = _entroloop("migrate", "--json", "--data-dir", str(folder))
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stdout.strip().splitlines()[-1]) == {"applied": []}


def test_settings_json_masks_secrets():
    result = runner.invoke(app, ["settings", "--json"], env={"ENTROLOOP_PII_HASH_KEY": "hunter2-secret-key"})
    assert result.exit_code == 0, result.output
    payload = json.loads(result.output.strip().splitlines()[-1])
    assert "ENTROLOOP_DATA_DIR" in payload
    assert "hunter2-secret-key" not in result.output


def test_demo_against_a_dead_broker_says_so_in_one_line(tmp_path):
    # a real process: librdkafka writes its retry log to the process's stderr, not through click
    proc = subprocess.run(
        [sys.executable, "-m", "entroloop.cli", "demo", "--broker", "kafka://127.0.0.1:1", "-n", "5",
         "--data-dir", str(tmp_path / "d")],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 2
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    assert re.search(r"broker at 127\.0\.0\.1:1 does not answer", lines[0])
    assert "Traceback" not in proc.stderr
