"""Parquet objects read back on the calling thread (entroloop/infra/worm/parquet_bytes.py).

Arrow's thread pools, once started, are torn down at process exit, and a pool thread still joinable
then aborts the process ("terminate called without an active exception"): `entroloop audit get`
printed its answer and died that way once in CI. These tests pin the cause away: reading starts no
thread at all, in a fresh interpreter, along the whole `audit get` path."""

from __future__ import annotations

import io
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from entroloop.infra.worm.parquet_bytes import read_matching, read_parquet


def _blob(rows: int = 2000, row_group_size: int = 500) -> bytes:
    table = pa.table({"audit_id": [f"id{i:05d}" for i in range(rows)], "user_id": [f"u{i % 7}" for i in range(rows)],
                      "n": list(range(rows))})
    buffer = io.BytesIO()
    pq.write_table(table, buffer, row_group_size=row_group_size, write_statistics=True)
    return buffer.getvalue()


def test_matching_rows_in_file_order_across_row_groups() -> None:
    blob = _blob()
    found = read_matching(blob, "audit_id", ["id01999", "id00003", "id00750", "nobody"])
    assert found.column("n").to_pylist() == [3, 750, 1999]
    assert read_matching(blob, "user_id", ["u3"]).column("n").to_pylist() == list(range(3, 2000, 7))
    assert read_matching(blob, "audit_id", ["zzz"]).num_rows == 0
    assert read_matching(blob, "audit_id", ["zzz"]).schema == read_parquet(blob).schema
    assert read_parquet(blob, columns=["n"]).column_names == ["n"]


def test_row_groups_whose_statistics_rule_the_values_out_are_not_decoded(monkeypatch) -> None:
    blob = _blob()
    decoded: list[list[int]] = []
    original = pq.ParquetFile.read_row_groups

    def spy(self, row_groups, *args, **kwargs):
        decoded.append(list(row_groups))
        return original(self, row_groups, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", spy)
    assert read_matching(blob, "audit_id", ["id00750"]).column("n").to_pylist() == [750]
    assert decoded == [[1]]  # ids 500..999 only
    assert read_matching(blob, "audit_id", ["zzz"]).num_rows == 0 and decoded[-1] == [1]  # nothing decoded


def test_audit_get_starts_no_arrow_thread(tmp_path: Path) -> None:
    """In a fresh interpreter, write an audit log, then look records up by audit id and by user id,
    as `entroloop audit get` does: the process has as many threads after the lookups as before."""
    script = textwrap.dedent(f"""
        import os
        from entroloop.contract.records import Audit
        from entroloop.infra.worm.reader import find_records
        from entroloop.infra.worm.worm_store import LocalWormStore
        from entroloop.sinks.audit.parquet_writer import AuditParquetWriter
        from entroloop.sinks.audit.stored_ids import chained_event_ids
        from tests.unit.sinks.sink_records import sample_records

        audits = sample_records(30, seed=5)[Audit.topic]
        store = LocalWormStore({str(tmp_path / "worm")!r})
        AuditParquetWriter(store).write(Audit.topic, 0, 0, len(audits) - 1, audits)
        before = len(os.listdir("/proc/self/task"))
        by_id = list(find_records(store, "audit_id", audits[3].audit_id))
        by_user = list(find_records(store, "user_id", audits[3].user_id))
        print(len(by_id), len(by_user) >= 1, before, len(os.listdir("/proc/self/task")))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          cwd=Path(__file__).resolve().parents[3])
    assert done.returncode == 0, done.stderr
    found, by_user, before, after = done.stdout.split()
    assert (found, by_user) == ("1", "True")
    assert after == before, f"reading started {int(after) - int(before)} threads (Arrow's pools)"
