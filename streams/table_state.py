"""A processor's durable state: a ``MutableMapping`` over a Faust table whose values are raw bytes.

A processor that declares ``table_state = TableStateSpec(name, encode, decode)`` gets, from the
Faust adapter (``streams.app``), a ``TableState`` as its ``state`` instead of a plain dict. The
table has a compacted changelog topic, so a restarted worker recovers the state from the broker.

Why the writes are buffered: processors run on an executor thread, but a Faust table can only be
changed on the event loop (``send_changelog`` uses the producer's buffer, and the changelog
partition comes from ``current_event()``, a context variable the thread does not see). So reads
and writes from the processor go to ``pending`` (key -> new value bytes, or ``None`` for a delete)
layered over the table, and ``flush()``, called on the event loop after the batch, applies them to
the table's store and sends them to the changelog: a value, or a tombstone for a delete, so a
deleted (expired) key is not resurrected by recovery. The changelog partition of a key is the
partition of the input record that wrote it (``partition``, set by the adapter per partition
group), which keeps the table co-partitioned with its input topics.

At-least-once: ``flush()`` runs before the agent acknowledges the batch, and Faust flushes the
producer before it commits offsets, so a committed input offset implies its state change is in
the changelog.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import msgspec

V = TypeVar("V")


@dataclass(frozen=True)
class TableStateSpec(Generic[V]):
    """What a processor declares to get durable state: the table name and the value codec."""

    name: str
    encode: Callable[[V], bytes]
    decode: Callable[[bytes], V]

    @classmethod
    def msgpack(cls, name: str, value_type: type[V]) -> TableStateSpec[V]:
        """A table of msgspec Structs of ``value_type``, stored as msgpack bytes."""
        return cls(name, msgspec.msgpack.Encoder().encode, msgspec.msgpack.Decoder(value_type).decode)


class TableState(MutableMapping[str, V]):
    """``str`` keys and decoded values over a Faust table of ``bytes`` keys and ``bytes`` values."""

    def __init__(self, table: Any, spec: TableStateSpec[V]) -> None:
        self.table = table
        self.spec = spec
        self.partition: int | None = None
        """The input partition of the records being processed (set by the adapter)."""
        self._pending: dict[bytes, tuple[int, bytes | None]] = {}
        # key -> (raw bytes, decoded value): decoding once per change, not once per read, matters
        # because expiry scans every entry after every batch.
        self._decoded: dict[bytes, tuple[bytes, V]] = {}
        self._partition_of: dict[bytes, int] = {}
        # Reads/writes (processor thread) and flush (event loop) must not interleave.
        self._lock = threading.RLock()

    # --- reads and writes (processor thread) ---------------------------------------------------
    @property
    def _store(self) -> MutableMapping[bytes, bytes]:
        return self.table.data  # the table's store (memory:// here), a mapping of raw bytes

    def _raw(self, key: bytes) -> bytes | None:
        if key in self._pending:
            return self._pending[key][1]
        return self._store.get(key)

    def __getitem__(self, key: str) -> V:
        k = key.encode()
        with self._lock:
            raw = self._raw(k)
            if raw is None:
                raise KeyError(key)
            cached = self._decoded.get(k)
            if cached is not None and cached[0] is raw:
                return cached[1]
            value = self.spec.decode(raw)
            self._decoded[k] = (raw, value)
            return value

    def __setitem__(self, key: str, value: V) -> None:
        k = key.encode()
        raw = self.spec.encode(value)
        with self._lock:
            self._pending[k] = (self._partition_for(k), raw)
            self._decoded[k] = (raw, value)

    def __delitem__(self, key: str) -> None:
        k = key.encode()
        with self._lock:
            if self._raw(k) is None:
                raise KeyError(key)
            self._pending[k] = (self._partition_for(k), None)
            self._decoded.pop(k, None)

    def __iter__(self) -> Iterator[str]:
        with self._lock:
            keys = [k for k in self._store if k not in self._pending]
            keys += [k for k, (_, raw) in self._pending.items() if raw is not None]
        return (k.decode() for k in keys)

    def __len__(self) -> int:
        return sum(1 for _ in self)

    def _partition_for(self, key: bytes) -> int:
        """The changelog partition of a write; raised here, on the processor's thread, when
        unknown, so the adapter turns the record into a dead letter: an exception in ``flush``
        would crash the agent, and Faust acknowledges a crashed agent's batch (the state lost)."""
        if self.partition is not None:
            return self.partition
        # A write outside a partition group (expiry): the partition the key was last written to
        # in this batch, before it, or recovered from (the memory store remembers that).
        if key in self._pending:
            return self._pending[key][0]
        if key in self._partition_of:
            return self._partition_of[key]
        recovered = getattr(self.table.data, "_key_partition", {})
        if key in recovered:
            return int(recovered[key])
        raise RuntimeError(f"no changelog partition for table key {key!r}: written outside a partition group")

    # --- flush (event loop) --------------------------------------------------------------------
    def flush(self) -> int:
        """Apply the pending writes to the table and its changelog; returns how many."""
        with self._lock:
            pending, self._pending = self._pending, {}
            store = self.table.data
            key_partition = getattr(store, "_key_partition", None)
            for key, (partition, raw) in pending.items():
                if raw is None:
                    store.pop(key, None)
                    self._partition_of.pop(key, None)
                    if key_partition is not None:
                        key_partition.pop(key, None)
                else:
                    store[key] = raw
                    self._partition_of[key] = partition
                    if key_partition is not None:
                        # The memory store drops keys of revoked partitions after a rebalance only
                        # if it knows their partition; it learns that only from recovery.
                        key_partition[key] = partition
                self.table.send_changelog(partition, key, raw, key_serializer="raw", value_serializer="raw")
        return len(pending)


__all__ = ["TableState", "TableStateSpec"]
