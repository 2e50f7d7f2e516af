"""Reading audit records back: by audit id or by user id, nothing else.

The compliance brief allows exactly these two lookups (an auditor's "show me this answer" and a
data subject's "show me everything about me"); there is deliberately no free-text search over
prompts and responses. Only files named by a manifest are read, so a file slipped into the store
is never served as evidence. Row-group statistics let Parquet skip most of each file.
"""

from __future__ import annotations

import io
from collections.abc import Iterator
from typing import Any

import pyarrow.parquet as pq

from sinks.audit.manifest import MANIFEST_PREFIX, Manifest
from sinks.audit.worm_store import WormStore

LOOKUP_COLUMNS = ("audit_id", "user_id")


def manifest_files(store: WormStore) -> list[str]:
    """Every data file the manifests name, in chain order."""
    keys = []
    for key in store.list(MANIFEST_PREFIX):
        keys.extend(f.key for f in Manifest.from_bytes(store.get(key)).files)
    return keys


def find_records(store: WormStore, column: str, value: str) -> Iterator[dict[str, Any]]:
    """Audit records whose ``column`` (``audit_id`` or ``user_id``) equals ``value``."""
    if column not in LOOKUP_COLUMNS:
        raise ValueError(f"audit records are read back by {' or '.join(LOOKUP_COLUMNS)} only")
    for key in manifest_files(store):
        table = pq.read_table(io.BytesIO(store.get(key)), filters=[(column, "=", value)])
        for row in table.to_pylist():
            row["emitted_at"] = row["emitted_at"].timestamp()
            row["_object"] = key
            yield row
