"""Attacks on a local audit log by someone with write access to its folder but not the signing key.

Each one leaves the log internally consistent (hash chain, Merkle roots and heads all agree), so a
verifier that reads the newest head from the same folder says "intact"; only signed checkpoints
kept elsewhere catch them. Objects are 0444: each attack chmods first, as an intruder would. Used by
the unit tests (tests/unit/sinks/test_audit_anchor*.py) and the reliability test on a sink-written log.
"""

from __future__ import annotations

import io
import os
import shutil
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from entroloop.sinks.audit.parquet_writer import AuditParquetWriter, parquet_bytes

from entroloop.contract.records import Audit
from entroloop.infra.worm.manifest import (
    FileEntry,
    Head,
    Manifest,
    merkle_root,
    sha256_hex,
)
from entroloop.infra.worm.worm_store import LocalWormStore

TOPIC = Audit.topic


def _overwrite(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.exists():
        os.chmod(path, 0o644)
    path.write_bytes(data)
    os.chmod(path, 0o444)


def _remove(path: Path) -> None:
    if path.exists():
        os.chmod(path, 0o644)
        path.unlink()


def chain_manifests(store: LocalWormStore, partition: int, topic: str = TOPIC) -> list[str]:
    return store.list(f"manifests/{topic}-p{partition:03d}-")


def drop_newest_batch(store: LocalWormStore, partition: int = 0) -> str:
    """Truncation: the newest batch of one chain goes, with its files and its head."""
    key = chain_manifests(store, partition)[-1]
    manifest = Manifest.from_bytes(store.get(key))
    for f in manifest.files:
        _remove(store.root / f.key)
    _remove(store.root / manifest.key)
    _remove(store.root / Head(manifest.chain, manifest.seq, "", "", 0).key)
    return manifest.chain


def delete_chain(store: LocalWormStore, partition: int = 1) -> str:
    """A whole chain (every batch, file and head of one partition) deleted."""
    keys = chain_manifests(store, partition)
    chain = Manifest.from_bytes(store.get(keys[0])).chain
    for key in keys:
        for f in Manifest.from_bytes(store.get(key)).files:
            _remove(store.root / f.key)
        _remove(store.root / key)
    heads = store.root / "heads" / chain
    for path in heads.glob("*"):
        _remove(path)
    shutil.rmtree(heads, ignore_errors=True)
    return chain


def rewrite_history(store: LocalWormStore, partition: int = 0, text: str = "FORGED ANSWER") -> str:
    """A consistent rewrite: the first record of the chain's first batch gets another response; its
    file hash, the Merkle root, every later manifest's link and every head are recomputed.
    Returns the audit id whose answer was changed."""
    prev_key, prev_sha = "", ""
    changed = ""
    for i, key in enumerate(chain_manifests(store, partition)):
        manifest = Manifest.from_bytes(store.get(key))
        files = list(manifest.files)
        if i == 0:
            entry = files[0]
            table = pq.read_table(io.BytesIO(store.get(entry.key)))
            responses = table.column("response").to_pylist()
            responses[0] = text
            changed = table.column("audit_id")[0].as_py()
            table = table.set_column(table.schema.get_field_index("response"), "response",
                                     pa.array(responses, type=table.schema.field("response").type))
            data = parquet_bytes(table)
            _overwrite(store.root / entry.key, data)
            files[0] = FileEntry(entry.key, sha256_hex(data), entry.records, len(data))
        forged = replace(manifest, files=tuple(files), merkle_root=merkle_root([f.sha256 for f in files]),
                         prev_manifest_key=prev_key, prev_manifest_sha256=prev_sha)
        data = forged.to_bytes()
        _overwrite(store.root / key, data)
        prev_key, prev_sha = key, sha256_hex(data)
        head = Head(forged.chain, forged.seq, key, prev_sha, forged.last_offset)
        _overwrite(store.root / head.key, head.to_bytes())
    return changed


def append_forged_batch(store: LocalWormStore, records: list[Audit], partition: int = 0) -> str:
    """A forged batch appended after the newest one, written by the project's own writer (so its
    files, manifest, chain link and head are exactly what a real batch has). Returns its audit ids'
    first id."""
    last = Manifest.from_bytes(store.get(chain_manifests(store, partition)[-1])).last_offset
    AuditParquetWriter(store).write(TOPIC, partition, last + 1, last + len(records), records)
    return records[0].audit_id


ATTACKS = ("truncation", "deleted chain", "consistent rewrite", "forged append")


__all__ = ["ATTACKS", "append_forged_batch", "chain_manifests", "delete_chain", "drop_newest_batch", "rewrite_history"]
