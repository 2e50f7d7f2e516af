"""Write-once object stores for the audit log.

``LocalWormStore`` is the embedded backend: each object is written to a temp file, fsynced,
linked into place with an exclusive create (an existing object is never replaced) and made
read-only. The S3 Object Lock backend has the same interface.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Protocol

from entroloop.infra.private_files import READ_ONLY_FILE, make_private_dir, open_private


class ObjectExists(Exception):
    """An object with this key already holds different bytes; the original is kept."""


class WormStore(Protocol):
    def put_once(self, key: str, data: bytes) -> bool:
        """Store ``data`` under ``key`` once. True if written now, False if the identical object
        was already there (a redelivery); ``ObjectExists`` if different bytes are there."""

    def get(self, key: str) -> bytes: ...

    def list(self, prefix: str = "") -> list[str]: ...

    def describe(self) -> str: ...


class LocalWormStore:
    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        make_private_dir(self.root)  # audit text is read by id through entroloop, not by other accounts

    def _path(self, key: str) -> Path:
        path = (self.root / key).resolve()
        if self.root.resolve() not in path.parents:
            raise ValueError(f"object key escapes the store: {key!r}")
        return path

    def put_once(self, key: str, data: bytes) -> bool:
        path = self._path(key)
        if path.exists():
            return self._same(path, data, key)
        if not path.parent.is_dir():
            make_private_dir(path.parent)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with open_private(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, READ_ONLY_FILE)  # 0400: write-once, and readable by the owner only
        try:
            os.link(tmp, path)  # atomic and exclusive: fails if the key appeared meanwhile
        except FileExistsError:
            return self._same(path, data, key)
        finally:
            tmp.unlink(missing_ok=True)
        dir_fd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        return True

    @staticmethod
    def _same(path: Path, data: bytes, key: str) -> bool:
        if hashlib.sha256(path.read_bytes()).digest() != hashlib.sha256(data).digest():
            raise ObjectExists(f"{key} already exists with different content; it is never overwritten")
        return False

    def get(self, key: str) -> bytes:
        return self._path(key).read_bytes()

    def list(self, prefix: str = "") -> list[str]:
        base = self.root
        keys = [
            str(p.relative_to(base))
            for p in base.rglob("*")
            if p.is_file() and not p.name.startswith(".")
        ]
        return sorted(k for k in keys if k.startswith(prefix))

    def describe(self) -> str:
        return f"local:{self.root}"
