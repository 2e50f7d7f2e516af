"""Records the broker refused for good, kept on the serving node with the reason: never dropped.

Why: a record the broker will never take (one larger than the topic's ``max.message.bytes``, a
topic this client may not write) cannot wait in the spool: the replay would offer it again and
again, and every record spooled behind it would wait forever. It cannot be dropped either. So it
is appended here, one JSON line per record, in ``<spool folder>/rejected/<spool file name>.jsonl``
(0700 folder, 0600 file: the record holds prompts and answers), fsynced before the spool's cursor
moves past it, and the publisher sends a small ``DeadLetter`` (reason, size, SHA-256, the first
bytes) so the refusal shows in the ``dead_letters`` table.

Line: ``{"rejected_at", "topic", "key", "error", "reason", "size", "sha256", "value_b64"}``;
``value_b64`` is the encoded record (``entroloop.contract.codec``), base64. A crash after a record
is kept and before the spool's cursor passes it keeps it again on the next replay (same
``sha256``; the dead letter has the same id, deduplicated like any redelivery). Nothing re-sends these
records by itself: once the cause is fixed (say, the topic's ``max.message.bytes`` raised), an
operator produces ``value_b64`` decoded to ``topic`` with ``key``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import threading
import time
from pathlib import Path

from entroloop.infra.private_files import make_private_dir, open_private


class RejectedRecords:
    """An append-only JSONL file of refused records; created on the first refusal only."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()

    def keep(self, topic: str, key: bytes, value: bytes, error: str, reason: str) -> str:
        """Append one refused record (durably) and return its SHA-256."""
        sha256 = hashlib.sha256(value).hexdigest()
        line = json.dumps({
            "rejected_at": time.time(),
            "topic": topic,
            "key": key.decode(errors="replace"),
            "error": error,
            "reason": reason,
            "size": len(value),
            "sha256": sha256,
            "value_b64": base64.b64encode(value).decode(),
        }, ensure_ascii=False)
        with self._lock:
            make_private_dir(self.path.parent)
            with open_private(self.path, "ab") as fh:
                fh.write(line.encode() + b"\n")
                fh.flush()
                os.fsync(fh.fileno())
        return sha256


def read_rejected(path: Path) -> list[dict[str, object]]:
    """The kept records of one file, each with its decoded ``value`` bytes."""
    out: list[dict[str, object]] = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            entry["value"] = base64.b64decode(entry["value_b64"], validate=True)
        except (ValueError, KeyError) as exc:
            raise ValueError(f"{path}:{number}: not a rejected-record line ({exc})") from None
        out.append(entry)
    return out


__all__ = ["RejectedRecords", "read_rejected"]
