"""Small files that must survive a crash whole: written aside, fsynced, renamed into place.

A process killed (or a host losing power) while rewriting a file in place can leave it empty or
half written; a reader then sees neither the old state nor the new one. Writing a temporary file
next to it, fsyncing it, renaming it over the old one and fsyncing the folder (so the rename
itself is on disk) leaves either the old file or the new one, never a mixture. Used for the
embedded bus's committed offsets and its journal of batch cuts.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from entroloop.infra.private_files import open_private


def fsync_dir(path: Path) -> None:
    """Make the entries of folder ``path`` (files created or renamed in it) durable."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomically(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` so that a crash at any instant leaves the old or the new file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    with open_private(tmp, "wb") as fh:  # offsets and batch cuts are nobody else's business: 0600
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def write_json_atomically(path: Path, value: Any) -> None:
    """``write_atomically`` of ``value`` as JSON (sorted keys, so equal states give equal bytes)."""
    write_atomically(path, json.dumps(value, sort_keys=True).encode())


def read_json(path: Path, default: Any) -> Any:
    """The JSON in ``path``, or ``default`` when the file does not exist yet."""
    path = Path(path)
    if not path.exists():
        return default
    return json.loads(path.read_bytes())
