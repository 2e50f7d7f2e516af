"""The embedded bus: Kafka's model (topics, partitions, offsets, committed positions) in one process.

It carries the same bytes the Kafka topics carry, keyed and partitioned the same way, and keeps
them in append-only files under ``DIR/log`` so a demo's events can be replayed later. Each frame
holds the producer's event id beside the key: appending an event id that the topic already holds
is a no-op, as with Kafka's idempotent producer, so re-running processors over old input does not
grow the derived topics.

Frame layout (little-endian): ``u32 key_len, u32 id_len, u32 value_len, key, event_id, value``.
"""

from __future__ import annotations

import json
import os
import struct
from collections import defaultdict
from pathlib import Path

from entroloop.contract.topics import partition_for

_FRAME = struct.Struct("<III")


class LocalLog:
    def __init__(self, root: Path, partitions: int) -> None:
        self.root = Path(root)
        self.partitions = partitions
        self.root.mkdir(parents=True, exist_ok=True)
        self._values: dict[tuple[str, int], list[tuple[str, bytes]]] = defaultdict(list)
        self._ids: dict[str, set[str]] = defaultdict(set)
        self._files: dict[tuple[str, int], object] = {}
        self._load()

    def _path(self, topic: str, partition: int) -> Path:
        return self.root / topic / f"{partition:03d}.log"

    def _load(self) -> None:
        for path in sorted(self.root.glob("*/*.log")):
            topic, partition = path.parent.name, int(path.stem)
            data = path.read_bytes()
            pos, frames = 0, self._values[(topic, partition)]
            while pos + _FRAME.size <= len(data):
                klen, ilen, vlen = _FRAME.unpack_from(data, pos)
                end = pos + _FRAME.size + klen + ilen + vlen
                if end > len(data):
                    break  # a torn frame from a crash mid-append: everything before it is intact
                p = pos + _FRAME.size
                key = data[p : p + klen].decode()
                event_id = data[p + klen : p + klen + ilen].decode()
                frames.append((key, data[p + klen + ilen : end]))
                if event_id:
                    self._ids[topic].add(event_id)
                pos = end
            if pos != len(data):
                with open(path, "r+b") as fh:
                    fh.truncate(pos)

    def append(self, topic: str, key: str, value: bytes, event_id: str = "") -> tuple[int, int] | None:
        """Append one message; return (partition, offset), or None if ``event_id`` is already there."""
        if event_id:
            if event_id in self._ids[topic]:
                return None
            self._ids[topic].add(event_id)
        partition = partition_for(key, self.partitions)
        frames = self._values[(topic, partition)]
        frames.append((key, value))
        fh = self._files.get((topic, partition))
        if fh is None:
            path = self._path(topic, partition)
            path.parent.mkdir(parents=True, exist_ok=True)
            fh = self._files[(topic, partition)] = open(path, "ab")
        k, i = key.encode(), event_id.encode()
        fh.write(_FRAME.pack(len(k), len(i), len(value)) + k + i + value)
        return partition, len(frames) - 1

    def flush(self) -> None:
        for fh in self._files.values():
            fh.flush()
            os.fsync(fh.fileno())

    def close(self) -> None:
        self.flush()
        for fh in self._files.values():
            fh.close()
        self._files.clear()

    def topics(self) -> list[str]:
        return sorted({t for t, _ in self._values})

    def end_offset(self, topic: str, partition: int) -> int:
        return len(self._values.get((topic, partition), ()))

    def read(self, topic: str, partition: int, start: int, stop: int) -> list[tuple[str, bytes]]:
        return self._values.get((topic, partition), [])[start:stop]

    def count(self, topic: str) -> int:
        return sum(len(v) for (t, _), v in self._values.items() if t == topic)


class OffsetStore:
    """Committed consumer positions (next offset to read) per (topic, partition), in one JSON file."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._offsets: dict[str, int] = json.loads(self.path.read_text()) if self.path.exists() else {}

    def get(self, topic: str, partition: int) -> int:
        return self._offsets.get(f"{topic}:{partition}", 0)

    def commit(self, topic: str, partition: int, next_offset: int) -> None:
        self._offsets[f"{topic}:{partition}"] = next_offset

    def save(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._offsets, sort_keys=True))
        os.replace(tmp, self.path)

    def reset(self) -> None:
        self._offsets.clear()
        self.save()
