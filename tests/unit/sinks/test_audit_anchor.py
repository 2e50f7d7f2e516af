"""The audit log anchored outside its folder: signed checkpoints catch what the hash chain cannot.

Each attack below leaves the log internally consistent; every test first shows that the verifier
without checkpoints (the verifier as it was before anchors) still calls the attacked log intact,
then that the same verifier holding the log against the signed checkpoints names the attack.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from entroloop.sinks.audit.checkpointer import Checkpointer, checkpointer_from_settings
from entroloop.sinks.audit.parquet_writer import AuditParquetWriter
from entroloop.sinks.audit.verify import verify_store

from entroloop.contract.records import Audit
from entroloop.contract.settings import load_settings
from entroloop.infra.worm.anchors import (
    AnchorConfigError,
    ClickHouseAnchor,
    FolderAnchor,
    read_checkpoints,
)
from entroloop.infra.worm.checkpoints import (
    CheckpointSigner,
    KeyFileError,
    covered_files,
    generate_key_pair,
    load_private_key,
    load_public_key,
)
from entroloop.infra.worm.worm_store import LocalWormStore
from tests.unit.sinks.audit_attacks import (
    append_forged_batch,
    delete_chain,
    drop_newest_batch,
    rewrite_history,
)
from tests.unit.sinks.sink_records import sample_records

TOPIC = Audit.topic
BATCH = 25
LOG = "local"


def _audits(n: int = 150, seed: int = 11) -> list[Audit]:
    return sample_records(n, seed=seed, span_s=3 * 86_400)[TOPIC]


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    return generate_key_pair(tmp_path / "keys")


@pytest.fixture
def anchored(tmp_path: Path, keys) -> tuple[LocalWormStore, FolderAnchor]:
    """A two-chain log written with a checkpoint after every batch into a folder outside it."""
    store = LocalWormStore(tmp_path / "data" / "worm")
    anchor = FolderAnchor(tmp_path / "anchor")
    signer = CheckpointSigner(load_private_key(keys[0]), LOG, "test-writer")
    writer = AuditParquetWriter(store, checkpointer=Checkpointer(signer, [anchor]))
    audits = _audits()
    for partition in range(2):
        part = audits[partition::2]
        for first in range(0, len(part), BATCH):
            chunk = part[first : first + BATCH]
            writer.write(TOPIC, partition, first, first + len(chunk) - 1, chunk)
    assert writer.checkpointer is not None and writer.checkpointer.written == 6
    return store, anchor


def _verify(store: LocalWormStore, anchor: FolderAnchor, public_key: Path):
    return verify_store(store, read_checkpoints([anchor], LOG, load_public_key(public_key)))


def test_intact_anchored_log_verifies_and_names_its_anchor(anchored, keys):
    store, anchor = anchored
    report = _verify(store, anchor, keys[1])
    assert report.ok, report.problems
    assert report.anchored and report.anchor["checkpoints_valid"] == 6
    newest = report.anchor["newest"]
    assert newest["source"].startswith("file:") and newest["batches"] == 6
    assert newest["key_fingerprint"] == report.anchor["public_key"]
    assert json.dumps(report.as_dict())  # the CLI prints it as JSON


def test_without_checkpoints_the_report_says_internal_only(anchored):
    report = verify_store(anchored[0])
    assert report.ok and not report.anchored
    assert report.anchor["mode"] == "internal consistency only"


def test_truncation_is_detected(anchored, keys):
    store, anchor = anchored
    chain = drop_newest_batch(store, partition=0)
    assert verify_store(store).ok  # consistent: the verifier without an anchor says intact
    report = _verify(store, anchor, keys[1])
    assert not report.ok
    assert ("truncated", chain) in {(p.kind, p.key) for p in report.problems}


def test_deleted_chain_is_detected(anchored, keys):
    store, anchor = anchored
    chain = delete_chain(store, partition=1)
    assert verify_store(store).ok
    report = _verify(store, anchor, keys[1])
    assert ("missing", chain) in {(p.kind, p.key) for p in report.problems}


def test_consistent_rewrite_is_detected(anchored, keys):
    store, anchor = anchored
    rewrite_history(store, partition=0)
    assert verify_store(store).ok  # every hash, Merkle root and head recomputed
    report = _verify(store, anchor, keys[1])
    assert "rewritten" in report.kinds(), report.problems


def test_forged_append_is_detected(anchored, keys):
    store, anchor = anchored
    append_forged_batch(store, _audits(10, seed=99), partition=0)
    assert verify_store(store).ok
    report = _verify(store, anchor, keys[1])
    assert "unanchored" in report.kinds(), report.problems


def test_wrong_public_key_fails(anchored, tmp_path):
    store, anchor = anchored
    _, other_public = generate_key_pair(tmp_path / "other-keys")
    report = _verify(store, anchor, other_public)
    assert not report.ok
    assert {"bad_checkpoint", "no_checkpoint"} <= report.kinds()


def test_tampered_checkpoint_signature_fails(anchored, keys):
    """A checkpoint edited to match a truncated log (heads moved back) no longer verifies."""
    store, anchor = anchored
    newest = max(anchor.path.glob("*.json"))
    doc = json.loads(newest.read_bytes())
    payload = json.loads(doc["payload"])
    payload["heads"] = [h for h in payload["heads"] if not h["chain"].endswith("p001")]
    doc["payload"] = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    os.chmod(newest, 0o644)
    newest.write_text(json.dumps(doc))
    report = _verify(store, anchor, keys[1])
    assert not report.ok
    assert "bad_checkpoint" in report.kinds()
    assert any(p.key == f"file:{newest}" for p in report.problems if p.kind == "bad_checkpoint")


def test_every_n_batches_leaves_a_tail_unanchored_until_close(tmp_path, keys):
    store = LocalWormStore(tmp_path / "worm")
    anchor = FolderAnchor(tmp_path / "anchor")
    signer = CheckpointSigner(load_private_key(keys[0]), LOG, "w")
    writer = AuditParquetWriter(store, checkpointer=Checkpointer(signer, [anchor], every_batches=4))
    audits = _audits(60)
    for first in range(0, 60, 10):
        writer.write(TOPIC, 0, first, first + 9, audits[first : first + 10])
    assert "unanchored" in _verify(store, anchor, keys[1]).kinds()  # batches 4, 5 after the checkpoint at 3
    writer.close()
    assert _verify(store, anchor, keys[1]).ok


def test_covered_files_withholds_forged_and_rewritten_batches(anchored, keys):
    store, anchor = anchored
    checkpoints = read_checkpoints([anchor], LOG, load_public_key(keys[1]))
    before = covered_files(store, checkpoints)
    assert set(before) == {k for k in store.list() if k.startswith("audit/")}
    append_forged_batch(store, _audits(10, seed=99), partition=0)
    forged = {k for k in store.list() if k.startswith("audit/")} - set(before)
    assert forged and not forged & set(covered_files(store, checkpoints))
    rewrite_history(store, partition=0)
    after = covered_files(store, checkpoints)
    assert not any("-p000-" in k for k in after)  # the rewritten chain is covered no more
    assert any("-p001-" in k for k in after)


# --- keys and settings ---------------------------------------------------------------------------
def test_keygen_writes_a_private_key_only_its_owner_reads(tmp_path):
    private, public = generate_key_pair(tmp_path / "k")
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    assert load_public_key(public)
    with pytest.raises(KeyFileError, match="never overwritten"):
        generate_key_pair(tmp_path / "k")


def test_a_private_key_readable_by_others_is_refused(keys):
    os.chmod(keys[0], 0o644)
    with pytest.raises(KeyFileError, match="chmod 600"):
        load_private_key(keys[0])


def test_signing_key_inside_the_data_folder_is_refused(tmp_path):
    data = tmp_path / "data"
    private, _ = generate_key_pair(data / "keys")
    settings = load_settings(data_dir=data, audit_signing_key_file=private, audit_checkpoint_dir=tmp_path / "cp")
    with pytest.raises(AnchorConfigError, match="ENTROLOOP_AUDIT_SIGNING_KEY_FILE.*outside"):
        checkpointer_from_settings(settings, LocalWormStore(data / "worm"))


def test_checkpoint_folder_inside_the_data_folder_is_refused(tmp_path, keys):
    data = tmp_path / "data"
    settings = load_settings(data_dir=data, audit_signing_key_file=keys[0], audit_checkpoint_dir=data / "cp")
    with pytest.raises(AnchorConfigError, match="ENTROLOOP_AUDIT_CHECKPOINT_DIR"):
        checkpointer_from_settings(settings, LocalWormStore(data / "worm"))


def test_no_signing_key_means_no_checkpointer(tmp_path):
    assert checkpointer_from_settings(load_settings(data_dir=tmp_path), LocalWormStore(tmp_path / "worm")) is None


# --- the ClickHouse anchor (chDB, the same SQL as the server) -----------------------------------
def test_clickhouse_anchor_round_trip_and_truncation(tmp_path, keys, chdb_client, ch_database):
    from entroloop.infra.clickhouse.schema import migrate

    migrate(chdb_client, ch_database)
    anchor = ClickHouseAnchor(chdb_client, ch_database)
    store = LocalWormStore(tmp_path / "worm")
    signer = CheckpointSigner(load_private_key(keys[0]), LOG, "ch-writer")
    writer = AuditParquetWriter(store, checkpointer=Checkpointer(signer, [anchor]))
    audits = _audits(60)
    for first in range(0, 60, 20):
        writer.write(TOPIC, 0, first, first + 19, audits[first : first + 20])
    checkpoints = read_checkpoints([anchor], LOG, load_public_key(keys[1]))
    assert len(checkpoints.valid) == 3 and not checkpoints.invalid
    assert verify_store(store, checkpoints).ok
    assert read_checkpoints([anchor], "s3://other/", load_public_key(keys[1])).valid == []  # another log's rows
    drop_newest_batch(store, partition=0)
    assert "truncated" in verify_store(store, checkpoints).kinds()


def test_embedded_runner_checkpoints_into_its_own_clickhouse(tmp_path, keys, chdb_dsn, ch_database):
    """The embedded mode: the runner owns its chDB, so its audit writer's checkpoints go there."""
    from entroloop.contract.settings import Settings
    from entroloop.infra.worm.anchors import log_name
    from entroloop.runner import EmbeddedRunner

    settings = Settings(data_dir=tmp_path / "data", clickhouse_dsn=chdb_dsn, clickhouse_database=ch_database,
                        audit_store="local", partitions=2, audit_signing_key_file=keys[0])
    runner = EmbeddedRunner(settings, processors=[], batch_size=20)
    audits = sample_records(60, seed=12)[TOPIC]  # recent: inside the contract's event-time window
    for audit in audits:
        runner.publish(audit)
    runner.drain()
    runner.close()
    anchor = ClickHouseAnchor(runner.clickhouse.client, ch_database)
    checkpoints = read_checkpoints([anchor], log_name(settings), load_public_key(keys[1]))
    assert checkpoints.valid and checkpoints.newest is not None
    report = verify_store(runner.audit.store, checkpoints)
    assert report.ok and report.records == len(audits), report.problems
    drop_newest_batch(runner.audit.store, partition=0)
    assert "truncated" in verify_store(runner.audit.store, checkpoints).kinds()


class _DiesOnce(FolderAnchor):
    """An anchor whose first put fails, as if the writer died between a head and its checkpoint."""

    died = False

    def put(self, checkpoint, document):
        if not _DiesOnce.died:
            _DiesOnce.died = True
            raise ConnectionError("writer killed before the checkpoint")
        super().put(checkpoint, document)


def test_a_crash_between_head_and_checkpoint_is_signed_on_redelivery(tmp_path, keys):
    store = LocalWormStore(tmp_path / "worm")
    anchor = _DiesOnce(tmp_path / "anchor")
    signer = CheckpointSigner(load_private_key(keys[0]), LOG, "first")
    audits = _audits(20)
    with pytest.raises(ConnectionError):
        AuditParquetWriter(store, checkpointer=Checkpointer(signer, [anchor])).write(TOPIC, 0, 0, 19, audits)
    assert "no_checkpoint" in _verify(store, anchor, keys[1]).kinds()  # sealed, not yet signed
    restarted = CheckpointSigner(load_private_key(keys[0]), LOG, "second")
    writer = AuditParquetWriter(store, checkpointer=Checkpointer(restarted, [anchor]))
    assert writer.write(TOPIC, 0, 0, 19, audits) == []  # the uncommitted batch comes again: skipped
    assert _verify(store, anchor, keys[1]).ok
