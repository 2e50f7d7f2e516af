"""``entroloop audit keygen | verify | get`` with signed checkpoints kept outside the data folder."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from entroloop.sinks.audit.checkpointer import checkpointer_from_settings
from entroloop.sinks.audit.parquet_writer import AuditParquetWriter
from typer.testing import CliRunner

from entroloop.cli import app
from entroloop.contract.records import Audit
from entroloop.contract.settings import load_settings
from entroloop.infra.worm.worm_store import LocalWormStore
from tests.unit.sinks.audit_attacks import (
    append_forged_batch,
    drop_newest_batch,
    rewrite_history,
)
from tests.unit.sinks.sink_records import sample_records

runner = CliRunner()


def _keygen(out: Path) -> tuple[Path, Path, str]:
    result = runner.invoke(app, ["audit", "keygen", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return out / "audit_signing_key.pem", out / "audit_signing_key.pub.pem", result.stdout.strip()


def _anchored_log(tmp_path: Path) -> tuple[Path, Path, Path, str, list[Audit]]:
    """data folder, public key, checkpoint folder (outside the data folder), fingerprint, audits."""
    private, public, fingerprint = _keygen(tmp_path / "keys")
    data, checkpoints = tmp_path / "data", tmp_path / "elsewhere" / "checkpoints"
    settings = load_settings(data_dir=data, audit_signing_key_file=private, audit_checkpoint_dir=checkpoints)
    store = LocalWormStore(data / "worm")
    writer = AuditParquetWriter(store, checkpointer=checkpointer_from_settings(settings, store))
    audits = sample_records(80, seed=21)[Audit.topic]
    for first in range(0, len(audits), 20):
        writer.write(Audit.topic, 0, first, first + 19, audits[first : first + 20])
    return data, public, checkpoints, fingerprint, audits


def _verify(data: Path, *extra: str) -> tuple[int, dict]:
    result = runner.invoke(app, ["audit", "verify", "--data-dir", str(data), "--json", *extra])
    return result.exit_code, json.loads(result.stdout)


def test_keygen_writes_a_0600_private_key_and_prints_the_fingerprint(tmp_path):
    private, public, fingerprint = _keygen(tmp_path / "keys")
    assert stat.S_IMODE(private.stat().st_mode) == 0o600 and public.exists()
    assert fingerprint.startswith("SHA256:")
    assert runner.invoke(app, ["audit", "keygen", "--out", str(tmp_path / "keys")]).exit_code == 2  # never overwrites


def test_verify_says_what_it_checked_against(tmp_path):
    data, public, checkpoints, fingerprint, _ = _anchored_log(tmp_path)
    code, report = _verify(data, "--public-key", str(public), "--checkpoint", str(checkpoints))
    assert code == 0 and report["ok"], report
    assert report["anchor"]["mode"] == "signed checkpoints" and report["anchor"]["public_key"] == fingerprint
    assert report["anchor"]["newest"]["source"].startswith(f"file:{checkpoints}")
    result = runner.invoke(app, ["audit", "verify", "--data-dir", str(data), "--public-key", str(public),
                                 "--checkpoint", str(checkpoints)])
    assert result.exit_code == 0 and "checked against 4 signed checkpoint(s)" in result.output
    assert fingerprint in result.output
    result = runner.invoke(app, ["audit", "verify", "--data-dir", str(data)])
    assert result.exit_code == 0 and "only internal consistency was checked" in result.output


def test_verify_cli_fails_on_a_truncated_log(tmp_path):
    data, public, checkpoints, _, _ = _anchored_log(tmp_path)
    drop_newest_batch(LocalWormStore(data / "worm"))
    assert _verify(data)[0] == 0  # internal consistency alone: "intact" (the finding)
    code, report = _verify(data, "--public-key", str(public), "--checkpoint", str(checkpoints))
    assert code == 1 and [p["kind"] for p in report["problems"]] == ["truncated"]


def test_verify_with_a_key_but_no_checkpoint_anywhere_fails(tmp_path):
    data, public, _, _, _ = _anchored_log(tmp_path)
    code, report = _verify(data, "--public-key", str(public))  # the checkpoint folder not given
    assert code == 1 and "no_checkpoint" in {p["kind"] for p in report["problems"]}


def test_get_withholds_a_forged_answer(tmp_path):
    data, public, checkpoints, _, _ = _anchored_log(tmp_path)
    forged = sample_records(5, seed=77)[Audit.topic]
    audit_id = append_forged_batch(LocalWormStore(data / "worm"), forged)
    plain = runner.invoke(app, ["audit", "get", "--audit-id", audit_id, "--data-dir", str(data)])
    assert plain.exit_code == 0 and audit_id in plain.stdout  # unanchored read: served, with a warning
    assert "not checked against a signed checkpoint" in plain.stderr
    result = runner.invoke(app, ["audit", "get", "--audit-id", audit_id, "--data-dir", str(data),
                                 "--public-key", str(public), "--checkpoint", str(checkpoints)])
    assert result.exit_code == 1 and result.stdout == ""
    assert "withheld" in result.stderr


def test_get_withholds_a_rewritten_answer_and_serves_signed_ones(tmp_path):
    data, public, checkpoints, _, audits = _anchored_log(tmp_path)
    anchored = ["--public-key", str(public), "--checkpoint", str(checkpoints)]
    one = audits[3]
    result = runner.invoke(app, ["audit", "get", "--audit-id", one.audit_id, "--data-dir", str(data), *anchored])
    assert result.exit_code == 0 and json.loads(result.stdout)["response"] == one.response
    changed = rewrite_history(LocalWormStore(data / "worm"), partition=0)
    result = runner.invoke(app, ["audit", "get", "--audit-id", changed, "--data-dir", str(data), *anchored])
    assert result.exit_code == 1 and "FORGED ANSWER" not in result.stdout
