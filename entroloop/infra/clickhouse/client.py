"""Connecting to ClickHouse: chDB in-process (``chdb:///DIR``) or a server over HTTP.

A chDB data folder can be opened by one process at a time; a second process gets ClickHouse's
"Cannot lock file .../status". That is turned into ``ClickHouseLocked`` naming the folder and who
probably holds it, instead of a stack trace.
"""

from __future__ import annotations

import fcntl
import re
from pathlib import Path
from typing import Any

import clickhouse_connect

from entroloop.infra.private_files import make_private_dir


class ClickHouseLocked(RuntimeError):
    """The embedded ClickHouse folder is owned by another process."""


def _held_by_other_process(folder: Path) -> str | None:
    """If another process holds the folder's lock, describe it (ClickHouse flocks DIR/status)."""
    status = folder / "status"
    if not status.exists():
        return None
    with open(status, "rb") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            pid = re.search(rb"PID: (\d+)", fh.read())
            return f"process {pid[1].decode()}" if pid else "another process"
        fcntl.flock(fh, fcntl.LOCK_UN)
    return None


def connect(dsn: str, password: str = "") -> Any:
    """A clickhouse-connect client for ``dsn`` (``chdb:///DIR`` or ``http(s)://host:port``)."""
    if not dsn.startswith("chdb://"):
        return clickhouse_connect.get_client(dsn=dsn, password=password or None)
    folder = Path(dsn.removeprefix("chdb://"))
    if dsn.startswith("chdb:///") and "?" not in dsn and len(folder.parts) > 1:  # a folder, not chdb://memory
        make_private_dir(folder)  # chDB's parts hold redacted text and audit indexes: owner only
    try:
        return clickhouse_connect.get_client(dsn=dsn)
    except Exception as exc:  # chDB reports these as generic errors; name the cause and the fix
        holder = _held_by_other_process(folder)
        if holder:
            raise ClickHouseLocked(
                f"the embedded ClickHouse in {folder} is in use by {holder} (an entroloop demo, "
                "runner or sink owns it). Wait for it to finish or stop it; for concurrent readers "
                "use a ClickHouse server (ENTROLOOP_CLICKHOUSE_DSN=http://...)."
            ) from exc
        if "already initialized with path" in str(exc):
            raise ClickHouseLocked(
                f"this process already opened another embedded ClickHouse folder; chDB opens one "
                f"folder per process, so {folder} cannot be opened too. Use one data folder per process."
            ) from exc
        raise
