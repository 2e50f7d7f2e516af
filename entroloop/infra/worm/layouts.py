"""What each record type written to the audit log looks like there: schema, folders, read-back keys.

The write-once log holds two record types, each on its own topic and therefore in its own chains:

* ``Audit`` (``entroloop.audit.v1``): what was asked and answered, under
  ``audit/model=M/day=YYYY-MM-DD/``; read back by ``audit_id`` or ``user_id`` only;
* ``Action`` (``entroloop.actions.v1``): every alert runbook step and every retraining-loop step,
  under ``actions/action=A/day=YYYY-MM-DD/``; read back by ``action_id`` or ``alert_key`` (the
  alert key, or the trigger key / adapter id the retraining loop files its steps under) only.

One ``RecordLayout`` per type, so the writer, the reader and the verifier stay one class each and a
further record type is one more layout, not another copy of the writer.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from entroloop.contract.records import Action, Audit, Event
from entroloop.infra.worm.manifest import ACTION_DATA_PREFIX, DATA_PREFIX, safe_name

# The envelope every record carries (entroloop.contract.records.Event), first in every schema.
ENVELOPE_FIELDS = [
    ("event_id", pa.string()),
    ("emitted_at", pa.timestamp("ms", tz="UTC")),
    ("node_id", pa.string()),
    ("seq", pa.int64()),
    ("request_id", pa.string()),
    ("trace_id", pa.string()),
    ("schema_version", pa.int16()),
]

AUDIT_SCHEMA = pa.schema(
    [
        *ENVELOPE_FIELDS,
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
        ("outcome", pa.string()),
        ("part_index", pa.int32()),
        ("part_count", pa.int32()),
    ]
)

ACTION_SCHEMA = pa.schema(
    [
        *ENVELOPE_FIELDS,
        ("action_id", pa.string()),
        ("action", pa.string()),
        ("alert_key", pa.string()),
        ("runbook", pa.string()),
        ("runbook_version", pa.string()),
        ("dry_run", pa.bool_()),
        ("outcome", pa.string()),
        ("detail", pa.string()),
    ]
)

_sorted_json = msgspec.json.Encoder(order="sorted").encode


def day_of(ts: float) -> str:
    """``YYYY-MM-DD`` (UTC) of a unix time: the ``day=`` folder of a record."""
    return time.strftime("%Y-%m-%d", time.gmtime(ts))


@dataclass(frozen=True)
class RecordLayout:
    """How one record type is stored in the audit log."""

    record_type: type[Event]
    schema: pa.Schema
    prefix: str
    """Top folder of its data files (one of ``manifest.DATA_PREFIXES``, without the slash)."""
    partition_by: str
    """The record field that names the first folder level (``model=...``, ``action=...``)."""
    lookups: tuple[str, ...]
    """The only columns its records may be read back by (no free-text search)."""
    json_columns: tuple[str, ...] = ()
    """Dict fields, stored as JSON with sorted keys so equal records give equal bytes."""

    @property
    def topic(self) -> str:
        return self.record_type.topic

    def folder(self, record: Event) -> str:
        """``prefix/partition_by=value/day=YYYY-MM-DD``: the folder of ``record``'s data file."""
        value = safe_name(str(getattr(record, self.partition_by)))
        return f"{self.prefix}/{self.partition_by}={value}/day={day_of(record.emitted_at)}"

    def table(self, records: Sequence[Event]) -> pa.Table:
        """Records -> an Arrow table of ``schema``, built column by column."""
        columns = []
        for name in self.schema.names:
            values = [getattr(r, name) for r in records]
            kind = self.schema.field(name).type
            if name == "emitted_at":
                ticks = (np.asarray(values, dtype=np.float64) * 1000).astype(np.int64)
                columns.append(pa.array(ticks, type=pa.int64()).cast(kind))
                continue
            if name in self.json_columns:
                values = [_sorted_json(v).decode() for v in values]
            columns.append(pa.array(values, type=kind))
        return pa.Table.from_arrays(columns, schema=self.schema)


AUDIT_LAYOUT = RecordLayout(
    Audit, AUDIT_SCHEMA, DATA_PREFIX.rstrip("/"), "model", lookups=("audit_id", "user_id"),
    json_columns=("sampling", "redactions"),
)
# Actions are few and read by what was done: one folder per action kind (pause_node, train.completed...)
ACTION_LAYOUT = RecordLayout(Action, ACTION_SCHEMA, ACTION_DATA_PREFIX.rstrip("/"), "action",
                             lookups=("action_id", "alert_key"))

LAYOUTS: tuple[RecordLayout, ...] = (AUDIT_LAYOUT, ACTION_LAYOUT)
LAYOUT_BY_TOPIC: dict[str, RecordLayout] = {layout.topic: layout for layout in LAYOUTS}
LOGGED_TOPICS: tuple[str, ...] = tuple(LAYOUT_BY_TOPIC)
"""The topics whose records go to the write-once log (the embedded runner and `sink audit` read these)."""


def join_audit_parts(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Audit rows read back, with the parts of each chunked audit joined into one row.

    The gateway publishes an audit too large for one record as ``part_count`` records sharing an
    ``audit_id`` (``Audit.part_index``). Their prompt and response slices are concatenated in part
    order; the joined row keeps the first part's other fields, ``_object`` lists every data file
    read, and ``parts_missing`` names any part not found (the row is then incomplete, never
    silently). Rows written before parts existed (no ``part_count``) pass through unchanged.
    """
    out: list[dict[str, Any]] = []
    groups: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        if (row.get("part_count") or 1) <= 1:
            out.append(row)
            continue
        if row["audit_id"] not in groups:
            groups[row["audit_id"]] = []
            out.append({"_parts_of": row["audit_id"]})  # placeholder: keeps the first part's position
        groups[row["audit_id"]].append(row)
    for i, row in enumerate(out):
        if "_parts_of" not in row:
            continue
        parts = {p["part_index"]: p for p in groups[row["_parts_of"]]}  # a redelivered part counts once
        ordered = [parts[k] for k in sorted(parts)]
        joined = dict(ordered[0])
        joined["prompt"] = "".join(p["prompt"] for p in ordered)
        joined["response"] = "".join(p["response"] for p in ordered)
        joined["part_index"] = 0
        if "_object" in joined:
            joined["_object"] = sorted({p["_object"] for p in ordered})
        missing = sorted(set(range(joined["part_count"])) - set(parts))
        if missing:
            joined["parts_missing"] = missing
        out[i] = joined
    return out


def layout_for(topic: str) -> RecordLayout:
    """The layout of ``topic``'s records; ``ValueError`` for a topic the audit log does not hold."""
    try:
        return LAYOUT_BY_TOPIC[topic]
    except KeyError:
        raise ValueError(f"the audit log holds {' and '.join(LOGGED_TOPICS)} only, not {topic!r}") from None


__all__ = [
    "ACTION_LAYOUT",
    "ACTION_SCHEMA",
    "AUDIT_LAYOUT",
    "AUDIT_SCHEMA",
    "LAYOUTS",
    "LAYOUT_BY_TOPIC",
    "LOGGED_TOPICS",
    "RecordLayout",
    "day_of",
    "join_audit_parts",
    "layout_for",
]
