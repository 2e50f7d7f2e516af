"""Records -> one Arrow table per ClickHouse insert, shaped by the table's own schema.

The column list and types come from ``DESCRIBE TABLE`` (ordinary columns only: MATERIALIZED and
DEFAULT ones are computed by ClickHouse), so a migration that adds a column needs no code here as
long as the record has an attribute of that name. Values are built column-wise, which is what
makes a columnar insert fast.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import pyarrow as pa

from entroloop.contract.records import Event

# Columns that are not record attributes but are computed from one (the text itself stays out).
COMPUTED: dict[str, dict[str, Callable[[Any], Any]]] = {
    "audit_index": {
        "prompt_chars": lambda r: len(r.prompt),
        "response_chars": lambda r: len(r.response),
    },
    "feedback": {"has_correction": lambda r: bool(r.corrected_answer)},
}

_INTS = {
    "UInt8": pa.uint8(), "UInt16": pa.uint16(), "UInt32": pa.uint32(), "UInt64": pa.uint64(),
    "Int8": pa.int8(), "Int16": pa.int16(), "Int32": pa.int32(), "Int64": pa.int64(),
}


@dataclass(frozen=True)
class Column:
    name: str
    ch_type: str


def _strip(ch_type: str, wrapper: str) -> str:
    return ch_type[len(wrapper) + 1 : -1] if ch_type.startswith(wrapper + "(") else ch_type


def _arrow_type(ch_type: str) -> pa.DataType:
    t = _strip(_strip(ch_type, "Nullable"), "LowCardinality")
    if t.startswith("Array("):
        return pa.list_(_arrow_type(t[6:-1]))
    if t.startswith("DateTime64"):
        precision = int(re.match(r"DateTime64\((\d+)", t)[1])
        return pa.timestamp("us" if precision > 3 else "ms", tz="UTC")
    if t in _INTS:
        return _INTS[t]
    if t in ("Float32", "Float64"):
        return pa.float32() if t == "Float32" else pa.float64()
    if t == "Bool":
        return pa.bool_()
    return pa.string()  # String, UUID


_json_encode = msgspec.json.Encoder().encode


def _json(value: Any) -> str:
    return _json_encode(value).decode()


def _column_array(values: list[Any], arrow_type: pa.DataType) -> pa.Array:
    """One column of values (all of one record attribute, so all of one Python type) -> Arrow.

    Conversions are chosen once per column and done in bulk (numpy for timestamps, Arrow's C
    converters for numbers and strings): a Python call per cell was the sink's bottleneck.
    """
    sample = next((v for v in values if v is not None), None)
    if sample is None:
        return pa.nulls(len(values), type=arrow_type)
    if pa.types.is_timestamp(arrow_type):
        scale = 1_000_000 if arrow_type.unit == "us" else 1000
        if any(v is None for v in values):
            return pa.array([None if v is None else int(v * scale) for v in values], type=arrow_type)
        ticks = (np.asarray(values, dtype=np.float64) * scale).astype(np.int64)
        return pa.array(ticks, type=pa.int64()).cast(arrow_type)
    if pa.types.is_string(arrow_type):
        if isinstance(sample, (dict, list, tuple)):
            values = [None if v is None else _json(v) for v in values]
        elif isinstance(sample, bytes):
            values = [None if v is None else v.decode("latin-1") for v in values]  # one char per byte
        elif not isinstance(sample, str):
            values = [None if v is None else str(v) for v in values]
        return pa.array(values, type=arrow_type)
    if pa.types.is_list(arrow_type) and isinstance(sample, tuple):
        values = [None if v is None else list(v) for v in values]
    return pa.array(values, type=arrow_type)


def _float16_lists(buffers: Sequence[bytes]) -> pa.Array:
    """Packed float16 entropy buffers -> Arrow list<float32>, without a Python loop per token."""
    lengths = np.fromiter((len(b) // 2 for b in buffers), dtype=np.int32, count=len(buffers))
    offsets = np.zeros(len(buffers) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = np.frombuffer(b"".join(buffers), dtype="<f2").astype(np.float32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat))


def build_table(table: str, columns: Sequence[Column], records: Sequence[Event]) -> pa.Table:
    """One Arrow table holding ``records`` in the order and types of ``columns``."""
    computed = COMPUTED.get(table, {})
    arrays, names = [], []
    for column in columns:
        arrow_type = _arrow_type(column.ch_type)
        if column.name in computed:
            fn = computed[column.name]
            values = [fn(r) for r in records]
        else:
            values = [getattr(r, column.name, None) for r in records]
        if pa.types.is_list(arrow_type) and values and isinstance(values[0], bytes):
            arrays.append(_float16_lists(values))
        else:
            arrays.append(_column_array(values, arrow_type))
        names.append(column.name)
    return pa.Table.from_arrays(arrays, names=names)
