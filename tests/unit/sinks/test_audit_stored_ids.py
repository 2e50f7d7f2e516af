"""A restarted audit writer reads back the ids its chains' newest sealed batches hold, so a copy of an
audit arriving right after the restart (a publisher's spool replay at another offset) is not a
second row in the write-once log; a tampered or missing object stops the read-back, never the writer.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from entroloop.sinks.audit.parquet_writer import AuditParquetWriter, parquet_bytes
from entroloop.sinks.audit.stored_ids import chained_event_ids
from entroloop.sinks.audit.verify import verify_store

from entroloop.contract.records import Audit
from entroloop.infra.worm.layouts import AUDIT_LAYOUT
from entroloop.infra.worm.manifest import Manifest, manifest_key
from entroloop.infra.worm.reader import manifest_files
from entroloop.infra.worm.worm_store import LocalWormStore
from tests.unit.sinks.audit_attacks import _overwrite, _remove
from tests.unit.sinks.audit_crashes import crash_before_the_manifest
from tests.unit.sinks.sink_records import sample_records

TOPIC = Audit.topic


def _audits(n: int) -> list[Audit]:
    audits = sample_records(n, seed=11)[TOPIC]
    assert len(audits) == n  # one audit per request
    return audits


def _stored_ids(store: LocalWormStore) -> list[str]:
    return [row["event_id"] for key in manifest_files(store, TOPIC)
            for row in pq.read_table(pa.BufferReader(store.get(key))).to_pylist()]


def _three_batches(store: LocalWormStore, audits: list[Audit]) -> None:
    writer = AuditParquetWriter(store)
    for first in (0, 10, 20):
        writer.write(TOPIC, 0, first, first + 9, audits[first:first + 10])


def test_a_restarted_writer_drops_a_copy_of_what_the_chain_stored(tmp_path: Path) -> None:
    store = LocalWormStore(tmp_path / "worm")
    audits = _audits(40)
    _three_batches(store, audits)
    restarted = AuditParquetWriter(store)  # a new process
    restarted.write(TOPIC, 0, 30, 41, [audits[4], *audits[30:40], audits[25]])  # two copies among new audits
    assert sorted(_stored_ids(store)) == sorted(a.event_id for a in audits)  # each once
    assert restarted.recent.dropped == 2
    assert verify_store(store).ok
    assert restarted.chain(TOPIC, 0).last_offset == 41  # the copies' offsets are covered: no gap


def test_without_the_read_back_the_copies_become_second_rows(tmp_path: Path) -> None:
    """What the read-back prevents (and what the writer did before it)."""
    store = LocalWormStore(tmp_path / "worm")
    audits = _audits(40)
    _three_batches(store, audits)
    AuditParquetWriter(store, seed_batches=0).write(TOPIC, 0, 30, 41, [audits[4], *audits[30:40], audits[25]])
    assert len(_stored_ids(store)) == 42


def test_only_the_newest_batches_are_read_back_oldest_first(tmp_path: Path) -> None:
    store = LocalWormStore(tmp_path / "worm")
    audits = _audits(30)
    _three_batches(store, audits)
    state = AuditParquetWriter(store, seed_batches=0).chain(TOPIC, 0)
    def batches_read_back(batches: int, limit: int | None = None) -> list[set[str]]:
        ids = chained_event_ids(store, state.manifest_key, state.manifest_sha256, batches, limit)
        return [set(ids[i:i + 10]) for i in range(0, len(ids), 10)]  # within a batch: by folder

    def ids_of(chunk: list[Audit]) -> set[str]:
        return {a.event_id for a in chunk}

    assert batches_read_back(2) == [ids_of(audits[10:20]), ids_of(audits[20:30])]
    assert batches_read_back(9) == [ids_of(audits[0:10]), ids_of(audits[10:20]), ids_of(audits[20:30])]
    # no more batches than hold ``limit`` records: the memory would forget the rest at once
    assert batches_read_back(9, limit=10) == [ids_of(audits[20:30])]
    assert batches_read_back(9, limit=11) == [ids_of(audits[10:20]), ids_of(audits[20:30])]


def test_a_replaced_data_file_teaches_the_writer_nothing(tmp_path: Path, caplog) -> None:
    """An intruder swaps the oldest batch's file for one holding the id of an audit still to come:
    the read-back stops at that file (it does not hash to its manifest entry), so the writer does not
    drop the genuine audit when it arrives, and the two newer batches are still read back."""
    store = LocalWormStore(tmp_path / "worm")
    audits = _audits(40)
    _three_batches(store, audits)
    oldest = Manifest.from_bytes(store.get(manifest_key(TOPIC, 0, 0, 9))).files[0].key
    _overwrite(store.root / oldest, parquet_bytes(AUDIT_LAYOUT.table([audits[35]])))
    with caplog.at_level(logging.WARNING, logger="entroloop.sinks.audit"):
        restarted = AuditParquetWriter(store)
        restarted.write(TOPIC, 0, 30, 40, [*audits[30:40], audits[15]])
    assert "does not hash to its manifest entry" in caplog.text
    stored = _stored_ids(store)
    assert stored.count(audits[35].event_id) == 2  # the planted row, and the genuine audit kept
    assert stored.count(audits[15].event_id) == 1  # the copy of a verified batch dropped


def test_a_missing_manifest_stops_the_read_back_not_the_writer(tmp_path: Path, caplog) -> None:
    store = LocalWormStore(tmp_path / "worm")
    audits = _audits(40)
    _three_batches(store, audits)
    middle = manifest_key(TOPIC, 0, 10, 19)
    _remove(store.root / middle)
    with caplog.at_level(logging.WARNING, logger="entroloop.sinks.audit"):
        restarted = AuditParquetWriter(store)
        restarted.write(TOPIC, 0, 30, 39, audits[30:40])
    assert "recent ids not read back" in caplog.text
    assert len(restarted.recent) == 10  # what it wrote itself


def test_a_batch_retried_after_a_crash_before_its_manifest_is_recognised_whole(tmp_path: Path) -> None:
    """SIGKILL between a batch's data files and its manifest, the batch holding a copy the writer
    left out: the restarted writer reads back the copy's (sealed) batch, leaves the copy out again,
    so the retry's files are byte for byte the ones already there - no second file, no second row."""
    store = LocalWormStore(tmp_path / "worm")
    audits = _audits(30)
    writer = AuditParquetWriter(store)
    writer.write(TOPIC, 0, 0, 9, audits[:10])
    batch = [*audits[10:20], audits[4]]  # audits[4] again, re-sent by a spool replay
    crash_before_the_manifest(store, writer, 10, 20, batch)
    assert store.list("manifests/") and len(store.list("manifests/")) == 1  # only the first batch is sealed

    restarted = AuditParquetWriter(store)
    restarted.write(TOPIC, 0, 10, 20, batch)
    assert restarted.files_written == 0 and restarted.files_skipped >= 1  # recognised, nothing rewritten
    assert not [k for k in store.list("audit/") if k.endswith(".rest.parquet")]
    assert sorted(_stored_ids(store)) == sorted(a.event_id for a in audits[:20])
    assert verify_store(store).ok
