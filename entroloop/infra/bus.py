"""The embedded bus: Kafka's model (topics, partitions, offsets, committed positions) in one process.

It carries the same bytes the Kafka topics carry, keyed and partitioned the same way, and keeps
them in append-only files under ``DIR/log`` so a demo's events can be replayed later. Each frame
holds the producer's event id beside the key: appending an event id that the topic already holds
is a no-op, as with Kafka's idempotent producer, so re-running processors over old input does not
grow the derived topics.

Frame layout (little-endian): ``u32 key_len, u32 id_len, u32 value_len, key, event_id, value``.

Crash consistency (a process may be SIGKILLed at any instruction): appends are buffered and made
durable by ``flush`` (write + fsync, once per file written since the last flush, plus the folder
when a file was created), which a consumer calls before it reads what it will store and before it
moves its offsets, so no committed offset ever points past what is on disk. A frame torn by a crash
mid-append is cut off when the log is opened again. ``OffsetStore`` and ``BatchCuts`` are rewritten
atomically (``entroloop.infra.durable_files``).
"""

from __future__ import annotations

import bisect
import os
import struct
from collections import defaultdict
from pathlib import Path
from typing import BinaryIO

from entroloop.contract.topics import partition_for
from entroloop.infra.durable_files import fsync_dir, read_json, write_json_atomically
from entroloop.infra.private_files import make_private_dir, open_private

_FRAME = struct.Struct("<III")


class LocalLog:
    """Append-only topic partitions in files under ``root``, all held in memory for reading."""

    def __init__(self, root: Path, partitions: int) -> None:
        self.root = Path(root)
        self.partitions = partitions
        make_private_dir(self.root)  # the logs hold prompts and answers: owner only (0700/0600)
        self._values: dict[tuple[str, int], list[tuple[str, bytes]]] = defaultdict(list)
        self._ids: dict[str, set[str]] = defaultdict(set)
        self._files: dict[tuple[str, int], BinaryIO] = {}
        self._dirty: set[tuple[str, int]] = set()  # written since the last flush
        self._new_dirs: set[Path] = set()  # folders whose new entries are not fsynced yet
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
                # a foreign writer's key or id that is not UTF-8 must not stop the log from opening
                # (the partition is the file's; the key only names dead letters): replace, go on
                key = data[p : p + klen].decode(errors="replace")
                event_id = data[p + klen : p + klen + ilen].decode(errors="replace")
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
            fh = self._files[(topic, partition)] = self._open(topic, partition)
        k, i = key.encode(), event_id.encode()
        fh.write(_FRAME.pack(len(k), len(i), len(value)) + k + i + value)
        self._dirty.add((topic, partition))
        return partition, len(frames) - 1

    def _open(self, topic: str, partition: int) -> BinaryIO:
        path = self._path(topic, partition)
        if not path.parent.exists():
            make_private_dir(path.parent)
            self._new_dirs.add(self.root)
        if not path.exists():
            self._new_dirs.add(path.parent)
        return open_private(path, "ab")

    def flush(self) -> None:
        """Make every append so far durable: write and fsync each file written since the last flush.

        Called once per batch of appends (a drain step), not per record: an fsync waits for the
        disk (milliseconds), and a demo appends thousands of records per step.
        """
        for key in sorted(self._dirty):
            fh = self._files[key]
            fh.flush()
            os.fsync(fh.fileno())
        self._dirty.clear()
        for folder in sorted(self._new_dirs, key=lambda p: len(p.parts), reverse=True):
            fsync_dir(folder)  # a new file (or topic folder) exists after a crash only once this ran
        self._new_dirs.clear()

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
    """Committed consumer positions (next offset to read) per (topic, partition), in one JSON file.

    ``save`` replaces the file atomically (temporary file, fsync, rename, fsync of the folder), so
    after a crash it holds the positions of the last completed ``save``, never a torn mixture.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._offsets: dict[str, int] = read_json(self.path, {})

    def get(self, topic: str, partition: int) -> int:
        return self._offsets.get(f"{topic}:{partition}", 0)

    def commit(self, topic: str, partition: int, next_offset: int) -> None:
        self._offsets[f"{topic}:{partition}"] = next_offset

    def save(self) -> None:
        write_json_atomically(self.path, self._offsets)

    def reset(self) -> None:
        self._offsets.clear()
        self.save()


class BatchCuts:
    """Where a consumer cut its batches, so that re-reading the log cuts the very same batches.

    A new batch ends at the next multiple of ``batch_size`` or at the end of what the partition
    held when it was read. A derived topic keeps growing while the log drains, so a replay (or a
    restart after a crash) would read one longer batch where the first pass read two. The
    ClickHouse sink's insert deduplication token names a batch by its offsets, so a batch cut
    differently is inserted again and the materialized per-minute rollups add its records a second
    time (raw tables hide it behind ``FINAL``). Journaling every end *before* the batch is stored,
    and cutting at journaled ends first, makes every re-read repeat the tokens the first pass used,
    whatever the batch size is by then.

    File format: ``{"topic:partition": [end, ...]}``, ascending, rewritten atomically.
    """

    def __init__(self, path: Path, batch_size: int) -> None:
        self.path = Path(path)
        self.batch_size = batch_size
        self._cuts: dict[str, list[int]] = read_json(self.path, {})
        self._changed = False

    def plan(self, topic: str, partition: int, start: int, end: int) -> list[tuple[int, int]]:
        """The ``[start, stop)`` batches covering ``start..end``; ends not cut before are journaled.

        Call ``save`` before storing any of them.
        """
        cuts = self._cuts.setdefault(f"{topic}:{partition}", [])
        batches: list[tuple[int, int]] = []
        while start < end:
            stop = min(end, (start // self.batch_size + 1) * self.batch_size)
            i = bisect.bisect_right(cuts, start)
            if i < len(cuts) and cuts[i] <= stop:
                stop = cuts[i]  # this range was cut here before: cut it here again
            else:
                cuts.insert(i, stop)
                self._changed = True
            batches.append((start, stop))
            start = stop
        return batches

    def last_end(self, topic: str, partition: int) -> int:
        """The furthest end journaled for ``topic``/``partition`` (0: none)."""
        cuts = self._cuts.get(f"{topic}:{partition}")
        return cuts[-1] if cuts else 0

    def save(self) -> None:
        """Persist the journal if ``plan`` added ends since the last save."""
        if self._changed:
            write_json_atomically(self.path, {k: v for k, v in self._cuts.items() if v})
            self._changed = False
