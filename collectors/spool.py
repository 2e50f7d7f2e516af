"""The publisher's local spool: an append-only file of length-prefixed frames, replayed in order.

When the broker is unreachable, encoded records are appended here instead of being lost, and the
publisher replays them, oldest first, once the broker is back. The file survives the process: a
publisher started later in the same spool folder adopts spool files left by dead processes.

On-disk frame (big-endian)::

    u32 body length | u32 CRC-32 of body | body = u16 topic length, topic, u16 key length, key, value

The CRC finds a torn tail (a crash in the middle of an append): reading stops there and the next
append truncates it away, so a crash costs at most the frame that was being written.

Replay progress is a read cursor (byte offset) kept in ``<spool>.cursor`` and advanced only after the
broker acknowledged every frame before it, so a crash during replay re-sends (at-least-once; the
sinks deduplicate by ``event_id``) and never skips. When everything is replayed, the file is
truncated to zero.

An exclusive ``flock`` on the spool file marks it as owned by a live process.
"""

from __future__ import annotations

import fcntl
import logging
import os
import struct
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from entroloop.infra.private_files import make_private_dir, open_private

log = logging.getLogger(__name__)

FsyncPolicy = Literal["always", "batch", "never"]
FSYNC_POLICIES: tuple[str, ...] = ("always", "batch", "never")

_HEADER = struct.Struct(">II")
_SHORT = struct.Struct(">H")
MAX_FRAME_BODY = 64 << 20
"""A length above this is corruption, not a record (records are capped far below it)."""


@dataclass(frozen=True, slots=True)
class SpooledMessage:
    """One spooled record: where it goes, its key and its encoded value; ``end`` is the byte
    offset just after its frame (the cursor value once it has been delivered)."""

    topic: str
    key: bytes
    value: bytes
    end: int


def encode_frame(topic: str, key: bytes, value: bytes) -> bytes:
    """One on-disk frame for (topic, key, value)."""
    topic_bytes = topic.encode()
    body = b"".join((_SHORT.pack(len(topic_bytes)), topic_bytes, _SHORT.pack(len(key)), key, value))
    return _HEADER.pack(len(body), zlib.crc32(body)) + body


def decode_body(body: bytes) -> tuple[str, bytes, bytes]:
    """(topic, key, value) of a frame body."""
    (topic_len,) = _SHORT.unpack_from(body, 0)
    topic = body[2 : 2 + topic_len].decode()
    pos = 2 + topic_len
    (key_len,) = _SHORT.unpack_from(body, pos)
    pos += 2
    return topic, body[pos : pos + key_len], body[pos + key_len :]


def iter_frames(data: bytes, start: int = 0) -> Iterator[SpooledMessage]:
    """Every intact frame of ``data`` from byte ``start``; stops silently at a torn or corrupt tail."""
    pos = start
    while pos + _HEADER.size <= len(data):
        length, crc = _HEADER.unpack_from(data, pos)
        body_start = pos + _HEADER.size
        if length > MAX_FRAME_BODY or body_start + length > len(data):
            return
        body = data[body_start : body_start + length]
        if zlib.crc32(body) != crc:
            return
        pos = body_start + length
        topic, key, value = decode_body(body)
        yield SpooledMessage(topic, key, value, pos)


class SpoolFull(Exception):
    """Appending would pass the spool's disk limit."""


class SpoolLocked(Exception):
    """Another live process owns this spool file."""


class Spool:
    """One spool file with its replay cursor. Thread-safe; owned by one process (flock)."""

    def __init__(self, path: Path, max_bytes: int, fsync: FsyncPolicy = "batch") -> None:
        if fsync not in FSYNC_POLICIES:
            raise ValueError(f"fsync policy must be one of {FSYNC_POLICIES}, got {fsync!r}")
        self.path = Path(path)
        self.cursor_path = self.path.with_name(self.path.name + ".cursor")
        self.max_bytes = max_bytes
        self.fsync = fsync
        self._lock = threading.Lock()
        make_private_dir(self.path.parent)  # spooled records hold prompts and answers: 0700/0600
        self._file = open_private(self.path, "a+b")  # lives as long as the spool
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.close()
            raise SpoolLocked(f"{self.path} is owned by another live process") from None
        self._dirty = False
        self._size = self._valid_size()
        self._cursor = min(self._read_cursor(), self._size)

    # --- state ---------------------------------------------------------------------------------
    def _valid_size(self) -> int:
        """Size up to the last intact frame; a torn tail from a crash is cut off here."""
        self._file.seek(0)
        data = self._file.read()
        end = 0
        for message in iter_frames(data):
            end = message.end
        if end != len(data):
            log.warning("spool %s: cutting a torn tail of %d bytes", self.path, len(data) - end)
            self._file.truncate(end)
            self._file.flush()
            os.fsync(self._file.fileno())
        return end

    def _read_cursor(self) -> int:
        try:
            return int(self.cursor_path.read_text().strip() or 0)
        except (FileNotFoundError, ValueError):
            return 0

    @property
    def size_bytes(self) -> int:
        return self._size

    @property
    def pending_bytes(self) -> int:
        """Bytes appended but not yet replayed."""
        return self._size - self._cursor

    def has_pending(self) -> bool:
        return self._size > self._cursor

    # --- writing -------------------------------------------------------------------------------
    def append(self, topic: str, key: bytes, value: bytes) -> None:
        """Append one frame; raise ``SpoolFull`` (nothing written) past the disk limit."""
        frame = encode_frame(topic, key, value)
        with self._lock:
            if self._size + len(frame) > self.max_bytes:
                raise SpoolFull(f"spool {self.path} would exceed its limit of {self.max_bytes} bytes")
            self._file.write(frame)
            self._size += len(frame)
            if self.fsync == "always":
                self._file.flush()
                os.fsync(self._file.fileno())
            else:
                self._dirty = True

    def sync(self) -> None:
        """End of a batch of appends: hand them to the OS, and to the disk under ``batch``."""
        with self._lock:
            if not self._dirty:
                return
            self._file.flush()
            if self.fsync == "batch":
                os.fsync(self._file.fileno())
            self._dirty = False

    # --- replay --------------------------------------------------------------------------------
    def read_pending(self, max_messages: int, max_bytes: int = 8 << 20) -> list[SpooledMessage]:
        """Up to ``max_messages`` frames after the cursor, in append order (nothing is consumed)."""
        with self._lock:
            if self._dirty:
                self._file.flush()
            start, stop = self._cursor, min(self._size, self._cursor + max_bytes)
            if stop <= start:
                return []
            self._file.seek(start)
            data = self._file.read(stop - start)
            self._file.seek(0, os.SEEK_END)
        out: list[SpooledMessage] = []
        for message in iter_frames(data):
            out.append(SpooledMessage(message.topic, message.key, message.value, start + message.end))
            if len(out) >= max_messages:
                break
        if not out and stop - start < self._size - start:
            # One frame larger than max_bytes: read exactly that frame.
            return self.read_pending(1, max_bytes=self._size - start)
        return out

    def advance(self, end: int) -> None:
        """Everything before byte ``end`` is delivered: move the cursor, or empty the file if done."""
        with self._lock:
            self._cursor = max(self._cursor, min(end, self._size))
            if self._cursor >= self._size:
                self._file.truncate(0)
                self._file.flush()
                os.fsync(self._file.fileno())
                self._size = self._cursor = 0
                self._dirty = False
            self._write_cursor(self._cursor)

    def _write_cursor(self, value: int) -> None:
        tmp = self.cursor_path.with_name(self.cursor_path.name + ".tmp")
        with open_private(tmp, "wb") as fh:
            fh.write(str(value).encode())
        os.replace(tmp, self.cursor_path)

    def close(self, remove_if_empty: bool = False) -> None:
        with self._lock:
            if self._file.closed:
                return
            self._file.flush()
            if self.fsync != "never":
                os.fsync(self._file.fileno())
            empty = self._size == 0
            if remove_if_empty and empty:
                self.path.unlink(missing_ok=True)
                self.cursor_path.unlink(missing_ok=True)
            self._file.close()  # releases the flock


def orphan_spools(folder: Path, own: Path) -> list[Path]:
    """Spool files in ``folder`` other than ``own`` (left by dead processes, or owned by live ones)."""
    if not folder.is_dir():
        return []
    return sorted(p for p in folder.glob("*.spool") if p.resolve() != own.resolve())
