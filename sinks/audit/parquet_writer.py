"""Audit records -> write-once Parquet files with a SHA-256 each and a manifest per batch.

Object keys are derived from the batch's (topic, partition, first offset, last offset), so a batch
redelivered after a crash maps to the same keys and is recognised instead of written twice.
Files are partitioned by model and day (``model=M/day=YYYY-MM-DD/``) so an auditor's question
about one model and one day touches few files.
"""

from __future__ import annotations

import hashlib
import io
import json
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec
import pyarrow as pa
import pyarrow.parquet as pq

from entroloop.records import Audit
from sinks.audit.worm_store import WormStore

AUDIT_SCHEMA = pa.schema(
    [
        ("event_id", pa.string()),
        ("emitted_at", pa.timestamp("ms", tz="UTC")),
        ("node_id", pa.string()),
        ("seq", pa.int64()),
        ("request_id", pa.string()),
        ("trace_id", pa.string()),
        ("schema_version", pa.int16()),
        ("audit_id", pa.string()),
        ("model", pa.string()),
        ("route", pa.string()),
        ("adapter", pa.string()),
        ("tenant", pa.string()),
        ("user_id", pa.string()),
        ("prompt_template_version", pa.string()),
        ("prompt", pa.string()),
        ("response", pa.string()),
        ("sampling", pa.string()),
        ("tokenizer_digest", pa.string()),
        ("engine_version", pa.string()),
        ("language", pa.string()),
        ("redactions", pa.string()),
    ]
)


@dataclass(frozen=True)
class WrittenFile:
    key: str
    sha256: str
    records: int
    bytes: int


def _day(ts: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(ts))


def _safe(value: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in value) or "_"


def audit_table(records: Sequence[Audit]) -> pa.Table:
    rows = []
    for r in records:
        row = msgspec.structs.asdict(r)
        row["emitted_at"] = int(r.emitted_at * 1000)
        row["sampling"] = json.dumps(r.sampling, sort_keys=True, ensure_ascii=False)
        row["redactions"] = json.dumps(r.redactions, sort_keys=True)
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=AUDIT_SCHEMA)


def parquet_bytes(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", write_statistics=True)
    return buf.getvalue()


class AuditParquetWriter:
    """Writes each audit batch once; counts files written and redeliveries recognised."""

    def __init__(self, store: WormStore, prefix: str = "audit") -> None:
        self.store = store
        self.prefix = prefix
        self.files_written = 0
        self.files_skipped = 0
        self.records_written = 0

    def write(
        self, topic: str, partition: int, first_offset: int, last_offset: int, records: Sequence[Audit]
    ) -> list[WrittenFile]:
        groups: dict[tuple[str, str], list[Audit]] = defaultdict(list)
        for r in records:
            groups[(r.model, _day(r.emitted_at))].append(r)
        batch = f"{_safe(topic)}-p{partition:03d}-{first_offset:012d}-{last_offset:012d}"
        files = []
        for (model, day), group in sorted(groups.items()):
            data = parquet_bytes(audit_table(group))
            key = f"{self.prefix}/model={_safe(model)}/day={day}/{batch}.parquet"
            created = self.store.put_once(key, data)
            files.append(WrittenFile(key, hashlib.sha256(data).hexdigest(), len(group), len(data)))
            if created:
                self.files_written += 1
                self.records_written += len(group)
            else:
                self.files_skipped += 1
        manifest = {
            "topic": topic,
            "partition": partition,
            "first_offset": first_offset,
            "last_offset": last_offset,
            "files": [f.__dict__ for f in files],
        }
        self.store.put_once(
            f"manifests/{batch}.json", json.dumps(manifest, sort_keys=True, indent=1).encode()
        )
        return files
