"""Tamper evidence of the write-once audit log: every kind of tampering is found and named.

Local objects are read-only (0444), so each test first has to chmod a file to change it: that is
the point — tampering takes a deliberate act, and the verifier then names what was done.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from entroloop.sinks.audit.parquet_writer import AuditChainError, AuditParquetWriter
from entroloop.sinks.audit.verify import verify_store

from entroloop.contract.records import Audit
from entroloop.infra.worm.manifest import Manifest, merkle_root, sha256_hex
from entroloop.infra.worm.reader import (
    find_records,
    find_records_for_keys,
    manifest_files,
)
from entroloop.infra.worm.worm_store import LocalWormStore, ObjectExists
from tests.unit.sinks.sink_records import sample_records

TOPIC = Audit.topic
BATCH = 25


def _audits(n: int = 150, seed: int = 11) -> list[Audit]:
    return sample_records(n, seed=seed, span_s=3 * 86_400)[TOPIC]  # three days: several day= folders


def _write_log(store: LocalWormStore, audits: list[Audit], partitions: int = 2) -> AuditParquetWriter:
    writer = AuditParquetWriter(store)
    for partition in range(partitions):
        part = audits[partition::partitions]
        for first in range(0, len(part), BATCH):
            chunk = part[first : first + BATCH]
            writer.write(TOPIC, partition, first, first + len(chunk) - 1, chunk)
    return writer


@pytest.fixture
def store(tmp_path: Path) -> LocalWormStore:
    s = LocalWormStore(tmp_path / "worm")
    _write_log(s, _audits())
    return s


def _path(store: LocalWormStore, key: str) -> Path:
    return store.root / key


def _writable(path: Path) -> Path:
    os.chmod(path, 0o644)
    return path


def _data_keys(store: LocalWormStore) -> list[str]:
    return [k for k in store.list("audit/")]


def _chain_manifests(store: LocalWormStore, partition: int = 0) -> list[str]:
    return store.list(f"manifests/{TOPIC}-p{partition:03d}-")


def test_intact_log_verifies_clean_and_counts_everything(store):
    report = verify_store(store)
    assert report.ok, report.problems
    assert report.chains == 2 and report.batches == 6 and report.records == 150
    assert report.files == len(_data_keys(store)) > report.batches  # several model/day files per batch


def test_redelivery_writes_nothing_and_keeps_the_log_clean(store):
    before = store.list()
    writer = _write_log(store, _audits())  # a fresh writer (restart) replays every batch
    assert writer.files_written == 0 and writer.batches_written == 0 and writer.batches_skipped == 6
    assert store.list() == before
    assert verify_store(store).ok


def test_flipping_one_byte_is_modified(store):
    key = _data_keys(store)[3]
    path = _writable(_path(store, key))
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    report = verify_store(store)
    assert [(p.kind, p.key) for p in report.problems] == [("modified", key)]


def test_deleting_a_file_is_missing(store):
    key = _data_keys(store)[0]
    path = _writable(_path(store, key))
    path.unlink()
    report = verify_store(store)
    assert [(p.kind, p.key) for p in report.problems] == [("missing", key)]


def test_swapping_two_batches_files_is_reordered(store):
    """The files of two consecutive batches of one chain trade places (same model and day)."""
    manifests = [Manifest.from_bytes(store.get(k)) for k in _chain_manifests(store)]
    by_folder: dict[str, list[str]] = {}
    for m in manifests:
        for f in m.files:
            by_folder.setdefault(f.key.rsplit("/", 1)[0], []).append(f.key)
    a, b = next(keys for keys in by_folder.values() if len(keys) >= 2)[:2]
    pa_, pb = _writable(_path(store, a)), _writable(_path(store, b))
    tmp = pa_.with_name("swap.tmp")
    pa_.rename(tmp)
    pb.rename(pa_)
    tmp.rename(pb)
    report = verify_store(store)
    assert {(p.kind, p.key) for p in report.problems} == {("reordered", a), ("reordered", b)}


def test_swapping_two_manifests_is_reordered_and_breaks_the_chain(store):
    first, second = _chain_manifests(store)[:2]
    p1, p2 = _writable(_path(store, first)), _writable(_path(store, second))
    d1, d2 = p1.read_bytes(), p2.read_bytes()
    p1.write_bytes(d2)
    p2.write_bytes(d1)
    kinds = verify_store(store).kinds()
    assert {"reordered", "broken_chain"} <= kinds


def test_inserting_a_forged_data_file_is_inserted(store):
    real = _data_keys(store)[0]
    forged = real.rsplit("/", 1)[0] + f"/{TOPIC}-p000-000000009000-000000009024.parquet"
    _path(store, forged).write_bytes(store.get(real))  # plausible name, valid Parquet
    report = verify_store(store)
    assert [(p.kind, p.key) for p in report.problems] == [("inserted", forged)]


def test_inserting_a_forged_batch_inside_the_chain_is_found(store):
    """A forged manifest that claims a place between two real batches, with a valid-looking body."""
    manifests = _chain_manifests(store)
    real = Manifest.from_bytes(store.get(manifests[0]))
    forged = Manifest(
        topic=real.topic, partition=real.partition, first_offset=real.last_offset + 1,
        last_offset=real.last_offset + 1, seq=real.seq + 1, files=(), merkle_root=merkle_root([]),
        prev_manifest_key=real.key, prev_manifest_sha256=sha256_hex(store.get(manifests[0])),
    )
    # offsets fall inside the next real batch's range only if it starts later; give it its own key
    _path(store, forged.key).write_bytes(forged.to_bytes())
    kinds = verify_store(store).kinds()
    assert kinds & {"inserted", "broken_chain"}, kinds


def test_editing_a_manifest_to_cover_a_modified_file_breaks_the_chain(store):
    """The forger changes a file and fixes its hash and Merkle root in the manifest: the next
    manifest (or the head) still holds the old manifest's hash."""
    key = _chain_manifests(store)[0]
    manifest = Manifest.from_bytes(store.get(key))
    target = manifest.files[0]
    path = _writable(_path(store, target.key))
    path.write_bytes(path.read_bytes() + b"\0")
    new_sha = sha256_hex(path.read_bytes())
    files = tuple(f if f.key != target.key else type(f)(f.key, new_sha, f.records, f.bytes + 1) for f in manifest.files)
    edited = Manifest(**{**manifest.__dict__, "files": files, "merkle_root": merkle_root([f.sha256 for f in files])})
    _writable(_path(store, key)).write_bytes(edited.to_bytes())
    report = verify_store(store)
    assert "broken_chain" in report.kinds()
    assert "modified" not in {p.kind for p in report.problems if p.key == target.key}  # the edit hid that


def test_deleting_a_whole_batch_is_missing(store):
    key = _chain_manifests(store)[1]
    manifest = Manifest.from_bytes(store.get(key))
    for f in manifest.files:
        _writable(_path(store, f.key)).unlink()
    _writable(_path(store, key)).unlink()
    report = verify_store(store)
    assert "missing" in report.kinds() and "broken_chain" in report.kinds()


def test_truncating_the_tail_is_missing(store):
    """Deleting the newest batch and its head still leaves older heads that name it... unless the
    newest head is deleted too; then the previous heads still agree: only a head beyond is missed.
    Here the newest manifest goes but its head stays."""
    key = _chain_manifests(store)[-1]
    manifest = Manifest.from_bytes(store.get(key))
    for f in manifest.files:
        _writable(_path(store, f.key)).unlink()
    _writable(_path(store, key)).unlink()
    report = verify_store(store)
    assert ("missing", key) in {(p.kind, p.key) for p in report.problems}


def test_manifest_without_head_is_unsealed_then_sealed_by_the_next_writer(tmp_path):
    store = LocalWormStore(tmp_path / "worm")
    _write_log(store, _audits(60), partitions=1)
    newest_head = store.list("heads/")[-1]
    _writable(_path(store, newest_head)).unlink()  # as if the writer crashed before the head
    assert verify_store(store).kinds() == {"unsealed"}
    writer = AuditParquetWriter(store)
    writer.chain(TOPIC, 0)  # opening the chain adopts the manifest and writes its head
    assert store.list("heads/")[-1] == newest_head
    assert verify_store(store).ok


def test_overlapping_cut_is_refused_and_changed_bytes_are_never_written(tmp_path):
    store = LocalWormStore(tmp_path / "worm")
    audits = _audits(60)
    writer = _write_log(store, audits, partitions=1)
    with pytest.raises(AuditChainError):
        writer.write(TOPIC, 0, 55, 80, audits[:26])
    key = store.list("audit/")[0]
    with pytest.raises(ObjectExists):
        store.put_once(key, b"other bytes")
    assert verify_store(store).ok


def test_verify_report_is_json_serialisable(store):
    report = verify_store(store).as_dict()
    assert json.loads(json.dumps(report)) == report


def test_lookup_for_many_audit_ids_equals_one_lookup_per_id_and_reads_each_file_once(store):
    audits = _audits()
    _write_log(store, audits)
    wanted = [a.audit_id for a in audits[::7]] + ["no-such-id"]
    one_by_one = [row for audit_id in wanted for row in find_records(store, "audit_id", audit_id)]
    reads: list[str] = []
    get = store.get
    store.get = lambda key: (reads.append(key), get(key))[1]  # type: ignore[method-assign]
    batched = list(find_records_for_keys(store, "audit_id", wanted))
    data_reads = [k for k in reads if k.startswith("audit/")]
    assert sorted(r["audit_id"] for r in batched) == sorted(r["audit_id"] for r in one_by_one)
    assert len(batched) == len(wanted) - 1
    assert len(data_reads) == len(set(data_reads)) == len(manifest_files(store, TOPIC))
    with pytest.raises(ValueError, match="audit_id or user_id"):
        list(find_records_for_keys(store, "prompt", ["x"]))
