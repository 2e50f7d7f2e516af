"""An intruder with write access to the audit folder but not the signing key, and a reader asking
for nobody: neither gets records it should not. Both failed before their fixes (found in an
attacker's review of the audit store); the third test keeps the honest retry working."""

from __future__ import annotations

import io
import json
from pathlib import Path

import msgspec
import pyarrow.parquet as pq
from entroloop.sinks.audit.checkpointer import Checkpointer
from entroloop.sinks.audit.parquet_writer import (
    AuditChainError,
    AuditParquetWriter,
    parquet_bytes,
)
from entroloop.sinks.audit.verify import verify_store
from typer.testing import CliRunner

from entroloop.cli import app
from entroloop.contract.records import Audit
from entroloop.infra.worm.anchors import FolderAnchor, read_checkpoints
from entroloop.infra.worm.checkpoints import (
    CheckpointSigner,
    generate_key_pair,
    load_private_key,
    load_public_key,
)
from entroloop.infra.worm.layouts import AUDIT_LAYOUT
from entroloop.infra.worm.manifest import batch_name
from entroloop.infra.worm.reader import find_records
from entroloop.infra.worm.worm_store import LocalWormStore
from tests.unit.sinks.audit_attacks import _overwrite
from tests.unit.sinks.audit_crashes import crash_before_the_manifest
from tests.unit.sinks.sink_records import sample_records

TOPIC = Audit.topic


def _audits(n: int = 40) -> list[Audit]:
    return sample_records(n, seed=5)[TOPIC]


def test_a_data_file_planted_at_the_next_batchs_key_is_refused_not_signed(tmp_path: Path):
    """An intruder with write access to the audit folder (not the key) plants a forged Parquet file at
    the predictable key of the NEXT batch. Before: the running writer met ObjectExists, adopted the
    forged bytes' hash into the manifest and signed it; verify (with checkpoints) said intact and
    `audit get --public-key` served the forged answer."""
    private, public = generate_key_pair(tmp_path / "keys")
    store = LocalWormStore(tmp_path / "data" / "worm")
    anchor = FolderAnchor(tmp_path / "anchor")
    writer = AuditParquetWriter(store, checkpointer=Checkpointer(
        CheckpointSigner(load_private_key(private), "local", "w"), [anchor]))
    audits = [replace_model(a) for a in _audits()]
    writer.write(TOPIC, 0, 0, 19, audits[:20])

    # attacker: forge the next batch's file (same model/day folder, predictable offsets)
    nxt = audits[20:40]
    forged = [msgspec.structs.replace(a, response="FORGED ANSWER") for a in nxt]
    folder = AUDIT_LAYOUT.folder(nxt[0])
    _overwrite(store.root / f"{folder}/{batch_name(TOPIC, 0, 20, 39)}.parquet",
               parquet_bytes(AUDIT_LAYOUT.table(forged)))

    try:
        writer.write(TOPIC, 0, 20, 39, nxt)  # the honest writer, still running, writes the real batch
    except AuditChainError:
        return  # fixed behaviour: the planted object is refused, nothing forged gets signed

    report = verify_store(store, read_checkpoints([anchor], "local", load_public_key(public)))
    stored = [r["response"] for r in find_records(store, "audit_id", nxt[0].audit_id)]
    # expected: the writer refuses (or verify flags) the foreign object; actual: forged text is signed evidence
    assert stored == [nxt[0].response] or not report.ok, (stored, report.problems)


def replace_model(a: Audit) -> Audit:
    return msgspec.structs.replace(a, model="m1")  # one folder, so the attacker's guess is easy


def test_an_empty_user_id_names_nobody(tmp_path: Path):
    """`audit get --user-id ""` is not a user id; it returns every record that has no user id
    (all anonymous users' prompts and answers)."""
    audits = [msgspec.structs.replace(a, user_id="" if i % 2 else f"user-{i}") for i, a in enumerate(_audits(20))]
    AuditParquetWriter(LocalWormStore(tmp_path / "worm")).write(TOPIC, 0, 0, len(audits) - 1, audits)
    result = CliRunner().invoke(app, ["audit", "get", "--user-id", "", "--data-dir", str(tmp_path)])
    rows = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    assert result.exit_code != 0 and rows == [], f"{len(rows)} records of other users returned"


def test_a_retried_batch_whose_file_holds_the_same_records_in_other_bytes_is_chained(tmp_path: Path):
    """The honest case behind ObjectExists: an earlier attempt of the same batch wrote its file with
    other bytes (another Parquet writer version; here: another compression). It holds exactly the
    batch's records, so the writer chains it and the records read back."""
    store = LocalWormStore(tmp_path / "worm")
    audits = [replace_model(a) for a in _audits(20)]
    folder = AUDIT_LAYOUT.folder(audits[0])
    other_bytes = io.BytesIO()
    pq.write_table(AUDIT_LAYOUT.table(audits), other_bytes, compression="gzip")
    assert other_bytes.getvalue() != parquet_bytes(AUDIT_LAYOUT.table(audits))
    store.put_once(f"{folder}/{batch_name(TOPIC, 0, 0, 19)}.parquet", other_bytes.getvalue())
    writer = AuditParquetWriter(store)
    writer.write(TOPIC, 0, 0, 19, audits)
    assert writer.files_skipped == 1
    assert verify_store(store).ok
    assert [r["response"] for r in find_records(store, "audit_id", audits[3].audit_id)] == [audits[3].response]


def test_a_batch_retried_after_a_crash_with_other_duplicates_filtered_is_chained_whole(tmp_path: Path):
    """The writer leaves out records it stored lately (a spool replay re-sent them at another offset).
    That memory dies with the process: after a crash between a batch's data file and its manifest,
    the redelivery filters less, the file at the batch's key holds fewer records than the retry's,
    and it was refused as planted - the audit sink stopped at that batch for good. Now the stored
    file is chained when every row of it is this batch's, and the rest goes to a second file."""
    store = LocalWormStore(tmp_path / "worm")
    audits = [replace_model(a) for a in _audits(30)]
    replayed = audits[5]
    first = AuditParquetWriter(store)
    first.write(TOPIC, 0, 0, 9, audits[:10])  # stored, and remembered
    batch = [*audits[10:20], replayed, *audits[20:30]]  # the spool re-sent audits[5] at offset 20
    crash_before_the_manifest(store, first, 10, 30, batch)

    second = AuditParquetWriter(store, seed_batches=0)  # a new process that read back no recent ids
    second.write(TOPIC, 0, 10, 30, batch)
    assert verify_store(store).ok
    for a in audits:
        responses = [r["response"] for r in find_records(store, "audit_id", a.audit_id)]
        assert responses[:1] == [a.response] and len(responses) == (2 if a is replayed else 1), a.audit_id


def test_a_planted_subset_file_cannot_hide_the_batchs_other_records(tmp_path: Path):
    """An intruder who plants honest rows of the next batch at its key (leaving one record out) does
    not suppress that record: it is written beside them and chained."""
    store = LocalWormStore(tmp_path / "worm")
    audits = [replace_model(a) for a in _audits(20)]
    folder = AUDIT_LAYOUT.folder(audits[0])
    hidden = audits[7]
    store.put_once(f"{folder}/{batch_name(TOPIC, 0, 0, 19)}.parquet",
                   parquet_bytes(AUDIT_LAYOUT.table([a for a in audits if a is not hidden])))
    AuditParquetWriter(store).write(TOPIC, 0, 0, 19, audits)
    assert verify_store(store).ok
    assert [r["response"] for r in find_records(store, "audit_id", hidden.audit_id)] == [hidden.response]


def test_the_second_file_of_a_retried_batch_follows_the_same_rule(tmp_path: Path):
    """Two crashes before the manifest, each retry knowing other recent ids: the first retry wrote
    both replays to the .rest file, the second retry (which knows one of them) must chain that file
    although it holds a record this retry left out."""
    store = LocalWormStore(tmp_path / "worm")
    audits = [replace_model(a) for a in _audits(30)]
    first_replay, second_replay = audits[2], audits[4]
    AuditParquetWriter(store).write(TOPIC, 0, 0, 9, audits[:10])
    batch = [*audits[10:20], first_replay, second_replay, *audits[20:30]]
    for knows in ([first_replay, second_replay], []):  # a crash before the manifest, twice
        writer = AuditParquetWriter(store, seed_batches=0)  # knows exactly ``knows``
        writer.recent.remember(knows)
        crash_before_the_manifest(store, writer, 10, 31, batch)
    last = AuditParquetWriter(store, seed_batches=0)
    last.recent.remember([second_replay])
    last.write(TOPIC, 0, 10, 31, batch)
    assert verify_store(store).ok
    for a in audits:
        responses = [r["response"] for r in find_records(store, "audit_id", a.audit_id)]
        assert responses[:1] == [a.response], a.audit_id
