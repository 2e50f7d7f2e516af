"""`entroloop actions` at the door: help that explains, the shared option spellings, a bad runbook
folder or a dead broker reported in one line before anything starts (the Kafka run itself is in
tests/integration/test_actions_kafka.py)."""

from __future__ import annotations

import subprocess
import sys

from typer.testing import CliRunner

from entroloop.cli import app

runner = CliRunner()


def _run(tmp_path, *args: str, **env: str) -> subprocess.CompletedProcess:
    # a real process: librdkafka writes its retry log to the process's stderr, not through click
    environment = {"PATH": "/usr/bin:/bin", "ENTROLOOP_DATA_DIR": str(tmp_path / "data"), **env}
    return subprocess.run([sys.executable, "-m", "entroloop.cli", "actions", *args], capture_output=True, text=True,
                          timeout=60, env=environment, check=False)


def test_help_explains_and_spells_options_like_the_other_commands():
    result = runner.invoke(app, ["actions", "--help"], env={"COLUMNS": "200", "TERM": "dumb", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    for option in ("--json", "--log-level", "--broker", "--until-idle"):
        assert option in result.output
    assert "once per alert" in result.output and "ENTROLOOP_ACTIONS_RUNBOOKS_DIR" in result.output


def test_a_dead_broker_is_one_line(tmp_path):
    proc = _run(tmp_path, "--broker", "kafka://127.0.0.1:1")
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, lines
    assert "127.0.0.1:1 does not answer" in lines[0] and "Traceback" not in proc.stderr
    assert not (tmp_path / "data").exists()  # nothing created for a run that never started


def test_a_missing_runbook_folder_stops_it_naming_the_setting_and_the_fix(tmp_path):
    proc = _run(tmp_path, "--broker", "127.0.0.1:1", ENTROLOOP_ACTIONS_RUNBOOKS_DIR=str(tmp_path / "typo"))
    assert proc.returncode == 2
    assert "ENTROLOOP_ACTIONS_RUNBOOKS_DIR" in proc.stderr and "unset it to use the packaged ones" in proc.stderr
    assert "does not answer" not in proc.stderr  # the runbooks are checked first


def test_a_bad_log_level_is_refused(tmp_path):
    proc = _run(tmp_path, "--broker", "127.0.0.1:1", "--log-level", "loud")
    assert proc.returncode == 2 and "--log-level must be one of" in proc.stderr
