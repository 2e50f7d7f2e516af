"""Connecting to ClickHouse: chDB in-process (``chdb:///DIR``) or a server over HTTP.

A chDB data folder can be opened by one process at a time; a second process gets ClickHouse's
"Cannot lock file .../status". That is turned into ``ClickHouseLocked`` naming the folder and who
probably holds it, instead of a stack trace.
"""

from __future__ import annotations

from typing import Any

import clickhouse_connect


class ClickHouseLocked(RuntimeError):
    """The embedded ClickHouse folder is owned by another process."""


def connect(dsn: str, password: str = "") -> Any:
    """A clickhouse-connect client for ``dsn`` (``chdb:///DIR`` or ``http(s)://host:port``)."""
    try:
        if dsn.startswith("chdb://"):
            return clickhouse_connect.get_client(dsn=dsn)
        return clickhouse_connect.get_client(dsn=dsn, password=password or None)
    except Exception as exc:  # chDB reports the lock as a generic error; recognise it by text
        if "lock" in str(exc).lower() and dsn.startswith("chdb://"):
            folder = dsn.removeprefix("chdb://")
            raise ClickHouseLocked(
                f"the embedded ClickHouse in {folder} is in use by another entroloop process "
                "(an embedded runner, demo or sink owns it). Wait for it to finish or stop it; "
                "for concurrent readers use a ClickHouse server (ENTROLOOP_CLICKHOUSE_DSN=http://...)."
            ) from exc
        raise
