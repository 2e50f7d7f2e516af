"""``entroloop audit verify`` exit codes and ``audit get`` by audit id / user id, on a real log."""

from __future__ import annotations

import json
import os
from pathlib import Path

from entroloop.sinks.audit.parquet_writer import AuditParquetWriter
from typer.testing import CliRunner

from entroloop.cli import app
from entroloop.contract.records import Audit
from entroloop.infra.worm.worm_store import LocalWormStore
from tests.unit.sinks.sink_records import sample_records

runner = CliRunner()


def _log(data_dir: Path) -> list[Audit]:
    audits = sample_records(80, seed=21)[Audit.topic]
    writer = AuditParquetWriter(LocalWormStore(data_dir / "worm"))
    for first in range(0, len(audits), 20):
        writer.write(Audit.topic, 0, first, first + 19, audits[first : first + 20])
    return audits


def test_verify_exits_zero_on_an_intact_log_and_one_naming_the_problem(tmp_path):
    _log(tmp_path)
    result = runner.invoke(app, ["audit", "verify", "--data-dir", str(tmp_path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["ok"] is True
    victim = next((tmp_path / "worm" / "audit").rglob("*.parquet"))
    os.chmod(victim, 0o644)
    victim.write_bytes(victim.read_bytes()[:-1] + b"X")
    result = runner.invoke(app, ["audit", "verify", "--data-dir", str(tmp_path), "--json"])
    assert result.exit_code == 1
    problems = json.loads(result.stdout)["problems"]
    assert [p["kind"] for p in problems] == ["modified"] and problems[0]["key"].endswith(victim.name)


def test_get_by_audit_id_and_by_user_id_only(tmp_path):
    audits = _log(tmp_path)
    one = audits[7]
    result = runner.invoke(app, ["audit", "get", "--audit-id", one.audit_id, "--data-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [(r["audit_id"], r["prompt"], r["response"]) for r in rows] == [(one.audit_id, one.prompt, one.response)]
    result = runner.invoke(app, ["audit", "get", "--user-id", one.user_id, "--data-dir", str(tmp_path)])
    got = sorted(json.loads(line)["audit_id"] for line in result.stdout.splitlines())
    assert got == sorted(a.audit_id for a in audits if a.user_id == one.user_id)
    assert runner.invoke(app, ["audit", "get", "--data-dir", str(tmp_path)]).exit_code == 2
    assert runner.invoke(app, ["audit", "get", "--audit-id", "nope", "--data-dir", str(tmp_path)]).exit_code == 1
