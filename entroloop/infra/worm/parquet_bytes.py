"""Reading a Parquet object held in memory without starting Arrow's thread pools.

``pq.read_table`` goes through Arrow's dataset layer, which starts Arrow's CPU and I/O thread pools
even with ``use_threads=False``. Those pools are torn down by C++ static destructors when the process
exits, and a pool thread still joinable at that moment aborts the process with "terminate called
without an active exception" (SIGABRT, apache/arrow#34314 and #39862). A short-lived reader such as
`entroloop audit get` printed its answer and then died that way about once in 600 runs on a loaded
2-core host, and once in CI. ``ParquetFile`` with ``pre_buffer=False`` and ``use_threads=False``
decodes on the calling thread and starts no pool, so nothing is left to tear down. The objects are
one write batch each (small), so the threads bought nothing.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq


def _open(blob: bytes) -> pq.ParquetFile:
    return pq.ParquetFile(io.BytesIO(blob), pre_buffer=False)


def read_parquet(blob: bytes, columns: Sequence[str] | None = None) -> pa.Table:
    """The whole object (or ``columns`` of it), decoded on this thread."""
    return _open(blob).read(columns=list(columns) if columns is not None else None, use_threads=False)


def _may_hold(row_group: pq.RowGroupMetaData, column: str, wanted: Sequence[str]) -> bool:
    """False only when the row group's statistics prove no value of ``wanted`` is in ``column``."""
    for index in range(row_group.num_columns):
        chunk = row_group.column(index)
        if chunk.path_in_schema != column:
            continue
        stats = chunk.statistics
        if stats is None or not stats.has_min_max:
            return True
        return any(stats.min <= value <= stats.max for value in wanted)
    return True


def read_matching(blob: bytes, column: str, wanted: Sequence[str]) -> pa.Table:
    """The rows whose string ``column`` equals one of ``wanted``, in file order. Row groups whose
    statistics rule every wanted value out are not decoded."""
    parquet = _open(blob)
    groups = [g for g in range(parquet.num_row_groups) if _may_hold(parquet.metadata.row_group(g), column, wanted)]
    table = parquet.read_row_groups(groups, use_threads=False) if groups else parquet.schema_arrow.empty_table()
    return table.filter(pc.is_in(table[column], value_set=pa.array(list(wanted), type=pa.string())))


__all__ = ["read_matching", "read_parquet"]
