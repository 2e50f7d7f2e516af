"""Action records in the write-once audit log: their own schema, folders and chains next to the
audit records', verified by the same verifier (tampering with an action file is found), and read
back only by action id or alert key through the manifests."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from entroloop.sinks.audit.parquet_writer import AuditParquetWriter
from entroloop.sinks.audit.verify import verify_store
from typer.testing import CliRunner

from entroloop.cli import app
from entroloop.contract.records import Action, Audit
from entroloop.infra.worm.layouts import ACTION_SCHEMA, AUDIT_SCHEMA
from entroloop.infra.worm.manifest import Manifest
from entroloop.infra.worm.reader import find_actions, find_records, manifest_files
from entroloop.infra.worm.worm_store import LocalWormStore
from tests.unit.sinks.action_records import KINDS, sample_actions
from tests.unit.sinks.sink_records import sample_records

BATCH = 10


def write_log(store: LocalWormStore, audits: list[Audit], actions: list[Action]) -> AuditParquetWriter:
    """Both topics, in batches of BATCH per partition, through one writer."""
    writer = AuditParquetWriter(store)
    for topic, records in ((Audit.topic, audits), (Action.topic, actions)):
        for partition in range(2):
            part = records[partition::2]
            for first in range(0, len(part), BATCH):
                chunk = part[first : first + BATCH]
                writer.write(topic, partition, first, first + len(chunk) - 1, chunk)
    return writer


@pytest.fixture
def logged(tmp_path: Path) -> tuple[LocalWormStore, list[Audit], list[Action]]:
    store = LocalWormStore(tmp_path / "worm")
    audits = sample_records(40, seed=5)[Audit.topic]
    actions = sample_actions(60)
    write_log(store, audits, actions)
    return store, audits, actions


def test_actions_get_their_schema_folders_and_chains(logged):
    store, _, _ = logged
    action_files = store.list("actions/")
    assert action_files and all(k.endswith(".parquet") for k in action_files)
    for key in action_files:
        _, action_dir, day_dir, name = key.split("/")
        assert action_dir.split("=", 1)[0] == "action" and action_dir.split("=", 1)[1] in KINDS
        assert day_dir in ("day=2026-09-21", "day=2026-09-22", "day=2026-09-23")
        assert name.startswith(f"{Action.topic}-p00")  # keys derived from (topic, partition, offsets)
        table = pq.read_table(io.BytesIO(store.get(key)))
        assert table.schema.equals(ACTION_SCHEMA, check_metadata=False)
        assert set(table.column("action").to_pylist()) == {action_dir.split("=", 1)[1]}
    for key in store.list("audit/"):
        assert pq.read_schema(io.BytesIO(store.get(key))).equals(AUDIT_SCHEMA, check_metadata=False)
    # one chain per topic partition: action manifests chain only to action manifests
    for key in store.list(f"manifests/{Action.topic}-"):
        manifest = Manifest.from_bytes(store.get(key))
        assert manifest.topic == Action.topic
        assert all(f.key.startswith("actions/") for f in manifest.files)
        assert manifest.prev_manifest_key.startswith(f"manifests/{Action.topic}-") or manifest.seq == 0
    assert sorted({k.split("/")[1] for k in store.list("heads/")}) == [
        f"{Action.topic}-p000", f"{Action.topic}-p001", f"{Audit.topic}-p000", f"{Audit.topic}-p001"]
    assert len(manifest_files(store, Action.topic)) == len(action_files)


def test_verify_covers_both_topics_and_a_redelivery_writes_nothing(logged):
    store, audits, actions = logged
    report = verify_store(store)
    assert report.ok, report.problems
    assert report.chains == 4
    assert report.records_by_topic == {Audit.topic: len(audits), Action.topic: len(actions)}
    before = store.list()
    again = write_log(store, audits, actions)  # a restarted writer sees every batch again
    assert again.files_written == 0 and again.batches_written == 0 and again.batches_skipped == 10
    assert store.list() == before


def test_flipping_a_byte_in_an_action_file_is_modified(logged):
    store, _, _ = logged
    key = store.list("actions/")[2]
    path = store.root / key
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    report = verify_store(store)
    assert [(p.kind, p.key) for p in report.problems] == [("modified", key)]


def test_a_forged_action_file_is_inserted_and_never_served(logged):
    store, _, actions = logged
    real = store.list("actions/")[0]
    forged = real.rsplit("/", 1)[0] + f"/{Action.topic}-p000-000000009000-000000009009.parquet"
    (store.root / forged).write_bytes(store.get(real))  # valid Parquet, plausible name
    assert [(p.kind, p.key) for p in verify_store(store).problems] == [("inserted", forged)]
    one = actions[0]
    rows = list(find_actions(store, "action_id", one.action_id))
    assert [r["_object"] for r in rows] == [real]  # the copy in the forged file is not read


def test_actions_read_back_by_action_id_or_alert_key_only(logged):
    store, audits, actions = logged
    one = actions[13]
    (row,) = find_actions(store, "action_id", one.action_id)
    assert {k: row[k] for k in ("action", "alert_key", "runbook", "dry_run", "outcome", "detail", "seq")} == {
        "action": one.action, "alert_key": one.alert_key, "runbook": one.runbook, "dry_run": one.dry_run,
        "outcome": one.outcome, "detail": one.detail, "seq": one.seq}
    assert row["emitted_at"] == pytest.approx(one.emitted_at, abs=1e-3)
    got = sorted(r["action_id"] for r in find_actions(store, "alert_key", one.alert_key))
    assert got == sorted(a.action_id for a in actions if a.alert_key == one.alert_key)
    for column in ("detail", "outcome", "audit_id"):
        with pytest.raises(ValueError):
            list(find_actions(store, column, "x"))
    # audit lookups are unchanged and never open action files
    assert [r["audit_id"] for r in find_records(store, "audit_id", audits[3].audit_id)] == [audits[3].audit_id]
    with pytest.raises(ValueError):
        list(find_records(store, "alert_key", one.alert_key))


def test_writer_refuses_records_of_another_type_and_topics_it_does_not_log(tmp_path):
    writer = AuditParquetWriter(LocalWormStore(tmp_path / "worm"))
    audits = sample_records(3, seed=2)[Audit.topic]
    with pytest.raises(TypeError):
        writer.write(Action.topic, 0, 0, 2, audits)
    with pytest.raises(ValueError):
        writer.write("entroloop.tokens.v1", 0, 0, 2, audits)
    with pytest.raises(ValueError):
        AuditParquetWriter(LocalWormStore(tmp_path / "w2"), topics=["entroloop.tokens.v1"])
    assert LocalWormStore(tmp_path / "worm").list() == []


runner = CliRunner()


def test_cli_audit_actions_by_action_id_and_alert_key(tmp_path):
    store = LocalWormStore(tmp_path / "worm")
    actions = sample_actions(30)
    write_log(store, sample_records(10, seed=3)[Audit.topic], actions)
    one = actions[4]
    result = runner.invoke(app, ["audit", "actions", "--action-id", one.action_id, "--data-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    assert [json.loads(line)["action_id"] for line in result.stdout.splitlines()] == [one.action_id]
    result = runner.invoke(app, ["audit", "actions", "--alert-key", one.alert_key, "--data-dir", str(tmp_path)])
    assert result.exit_code == 0, result.output
    got = sorted(json.loads(line)["action_id"] for line in result.stdout.splitlines())
    assert got == sorted(a.action_id for a in actions if a.alert_key == one.alert_key)
    assert runner.invoke(app, ["audit", "actions", "--data-dir", str(tmp_path)]).exit_code == 2
    both = ["audit", "actions", "--action-id", one.action_id, "--alert-key", one.alert_key, "--data-dir", str(tmp_path)]
    assert runner.invoke(app, both).exit_code == 2
    assert runner.invoke(app, ["audit", "actions", "--action-id", "nope", "--data-dir", str(tmp_path)]).exit_code == 1
    verify = runner.invoke(app, ["audit", "verify", "--data-dir", str(tmp_path), "--json"])
    assert verify.exit_code == 0 and json.loads(verify.stdout)["records_by_topic"][Action.topic] == len(actions)
