"""Case bundles: the last N anomalous requests like an alerted one, with everything needed to study
them offline (audit metadata, per-token entropies, spans, the alerts themselves), in one JSON file.

Rows come from a ``query(sql) -> list[dict]`` callable (the ClickHouse client of the composition
root), so this module holds the SQL but no connection. The file is written to a temporary name
and renamed, so a reader never sees half a bundle; its SHA-256 goes into the Action record.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
from collections.abc import Callable, Sequence
from datetime import date, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

from entroloop.contract.records import Alert

Query = Callable[[str], list[dict[str, Any]]]
BUNDLE_FORMAT = "entroloop.case_bundle.v1"
ALERT_SCOPE_COLUMNS = {"model": "model", "route": "route", "rule": "rule", "subject_node": "subject_node"}
DETAIL_TABLES = ("audit_index", "token_entropy", "spans", "alerts")


def client_query(client: Any) -> Query:
    """Adapt a clickhouse-connect client (chDB or server) to the ``query(sql) -> rows`` callable."""

    def query(sql: str) -> list[dict[str, Any]]:
        result = client.query(sql)
        return [dict(zip(result.column_names, row)) for row in result.result_rows]

    return query


def sql_string(value: str) -> str:
    """A ClickHouse string literal (backslash and quote escaped)."""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def anomalous_request_ids(query: Query, database: str, alert: Alert, scope: Sequence[str], last_n: int) -> list[str]:
    """The ``last_n`` most recently alerted requests sharing ``scope`` fields with ``alert``."""
    where = " AND ".join(f"{ALERT_SCOPE_COLUMNS[f]} = {sql_string(str(getattr(alert, f)))}" for f in scope) or "1"
    rows = query(
        f"SELECT request_id, max(emitted_at) AS last_alert FROM {database}.alerts "
        f"WHERE {where} AND request_id != '' GROUP BY request_id ORDER BY last_alert DESC, request_id LIMIT {int(last_n)}"
    )
    ids = [str(r["request_id"]) for r in rows]
    if alert.request_id and alert.request_id not in ids:  # the alerted request itself is always in
        ids = [alert.request_id, *ids[: max(last_n - 1, 0)]]
    return ids


def _plain(value: Any) -> Any:
    """JSON-safe values: datetimes as ISO text, UUIDs as text, NaN as null, arrays as lists."""
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, bytes):
        return value.decode(errors="replace")
    if hasattr(value, "tolist"):
        return _plain(value.tolist())
    return value


def collect(query: Query, database: str, request_ids: Sequence[str]) -> dict[str, list[dict[str, Any]]]:
    """Rows of every detail table for these requests (FINAL: one row per event after redelivery)."""
    if not request_ids:
        return {t: [] for t in DETAIL_TABLES}
    ids = ", ".join(sql_string(r) for r in request_ids)
    tables: dict[str, list[dict[str, Any]]] = {}
    for table in DETAIL_TABLES:
        rows = query(f"SELECT * FROM {database}.{table} FINAL WHERE request_id IN ({ids}) ORDER BY request_id, emitted_at")
        tables[table] = [{k: _plain(v) for k, v in row.items()} for row in rows]
    return tables


def bundle_filename(runbook: str, alert_key: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]+", "_", alert_key)[:80].strip("._") or "alert"
    digest = hashlib.sha256(alert_key.encode()).hexdigest()[:10]
    return f"{runbook}-{safe}-{digest}.json"


def write_bundle(folder: Path, name: str, content: dict[str, Any]) -> tuple[Path, str]:
    """Write atomically; return (path, sha256 of the bytes written)."""
    folder.mkdir(parents=True, exist_ok=True)
    data = json.dumps(content, sort_keys=True, ensure_ascii=False, indent=1).encode()
    path = folder / name
    tmp = folder / f".{name}.tmp"
    with open(tmp, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    return path, hashlib.sha256(data).hexdigest()


__all__ = ["BUNDLE_FORMAT", "Query", "anomalous_request_ids", "client_query", "bundle_filename", "collect", "sql_string", "write_bundle"]
