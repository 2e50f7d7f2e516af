"""A processor's durable state: a ``MutableMapping`` over a Faust table whose values are raw bytes.

A processor that declares ``table_state = TableStateSpec(name, encode, decode)`` gets, from the
Faust adapter (``entroloop.streams.app``), a ``TableState`` as its ``state`` instead of a plain dict. The
table has a compacted changelog topic, so a restarted worker recovers the state from the broker.

Why the writes are buffered: a processor may run on an executor thread (one that declares
``blocking``), but a Faust table can only be changed on the event loop (``send_changelog`` uses the
producer's buffer, and the changelog partition comes from ``current_event()``, a context variable
the thread does not see); and a key written many times in a batch is logged once. So reads
and writes from the processor go to ``pending`` (key -> new value, or a delete) layered over the
table; ``seal()``, called on the processor's thread at the end of a batch, encodes each written key
once (however often the batch wrote it); and ``flush()``, called on the event loop after the batch, applies them to
the table's store and sends them to the changelog: a value, or a tombstone for a delete, so a
deleted (expired) key is not resurrected by recovery. The changelog partition of a key is the
partition of the input record that wrote it, which keeps the table co-partitioned with its input
topics: when the spec says which key a record writes (``key_of``), the adapter hands the whole batch
over at once with each key's partition (``batch_partitions``); otherwise it hands the batch over one
input partition at a time (``partition``). A write outside a batch (expiry) goes to the partition the
key was last written to or recovered from.

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
    key_of: Callable[[Any], str] | None = None
    """The key an input record writes, if the processor writes no other key while processing a
    batch (its request id for the joins here). With it each key's changelog partition is its
    record's and the batch is processed in one call; without it, one call per input partition (a
    per-call cost: the entropy detector's 48-lag passes run once per call)."""

    @classmethod
    def msgpack(cls, name: str, value_type: type[V], key_of: Callable[[Any], str] | None = None) -> TableStateSpec[V]:
        """A table of msgspec Structs of ``value_type``, stored as msgpack bytes."""
        return cls(name, msgspec.msgpack.Encoder().encode, msgspec.msgpack.Decoder(value_type).decode, key_of)


_DELETED: Any = object()
"""A pending delete (a tombstone in the changelog)."""


class TableState(MutableMapping[str, V]):
    """``str`` keys and decoded values over a Faust table of ``bytes`` keys and ``bytes`` values.

    Writes are coalesced: a key written many times in a batch is encoded once, by ``seal()`` at the
    end of the batch (on the processor's thread), and sent to the changelog once, by ``flush()``.
    """

    def __init__(self, table: Any, spec: TableStateSpec[V]) -> None:
        self.table = table
        self.spec = spec
        self.partition: int | None = None
        """The input partition of the records being processed (set by the adapter per partition group)."""
        self.batch_partitions: dict[bytes, int] | None = None
        """Key -> input partition of the record that writes it, for the batch being processed (set by
        the adapter when the spec has ``key_of``)."""
        # key -> (partition, decoded value or _DELETED): written in the batch being processed, not
        # encoded yet (the processor may still change the value in place).
        self._pending: dict[bytes, tuple[int, Any]] = {}
        # key -> (partition, raw bytes or None): encoded by ``seal()``, waiting for ``flush()``.
        self._sealed: dict[bytes, tuple[int, bytes | None]] = {}
        # key -> (raw bytes, decoded value): decoding once per change, not once per read, matters
        # because expiry scans every entry after every batch.
        self._decoded: dict[bytes, tuple[bytes, V]] = {}
        self._partition_of: dict[bytes, int] = {}
        # key -> decoded value of every key, kept with the writes; None: rebuild from the store.
        self._live: dict[str, V] | None = None
        # Reads/writes (processor thread) and flush (event loop) must not interleave.
        self._lock = threading.RLock()
        self._watch_store()

    # --- reads and writes (processor thread) ---------------------------------------------------
    @property
    def _store(self) -> MutableMapping[bytes, bytes]:
        return self.table.data  # the table's store (memory:// here), a mapping of raw bytes

    def _watch_store(self) -> None:
        """Drop the decoded view whenever Faust changes the store itself (recovery from the
        changelog, revoked partitions dropped after a rebalance): it is rebuilt on the next use."""
        store = self._store

        def stale() -> None:
            self._live = None

        for name in ("apply_changelog_batch", "_clear", "clear", "reset_state"):
            method = getattr(store, name, None)
            if callable(method) and hasattr(store, "__dict__"):
                def sync(*args: Any, _method: Any = method, **kwargs: Any) -> Any:
                    try:
                        return _method(*args, **kwargs)
                    finally:
                        stale()
                setattr(store, name, sync)
        for name in ("on_recovery_completed", "on_rebalance"):
            method = getattr(store, name, None)
            if callable(method) and hasattr(store, "__dict__"):
                async def asynchronous(*args: Any, _method: Any = method, **kwargs: Any) -> Any:
                    try:
                        return await _method(*args, **kwargs)
                    finally:
                        stale()
                setattr(store, name, asynchronous)

    def _view(self) -> dict[str, V]:
        """Every key's current decoded value: the store, under the sealed and the pending writes."""
        live = self._live
        if live is not None:
            return live
        live = {}
        decoded = self._decoded
        store = self._store
        for k, raw in list(getattr(store, "data", store).items()):
            cached = decoded.get(k)
            if cached is None or cached[0] is not raw:
                cached = decoded[k] = (raw, self.spec.decode(raw))
            live[k.decode()] = cached[1]
        for k, (_, raw) in self._sealed.items():
            if raw is None:
                live.pop(k.decode(), None)
            else:
                live[k.decode()] = self._decoded[k][1]
        for k, (_, value) in self._pending.items():
            if value is _DELETED:
                live.pop(k.decode(), None)
            else:
                live[k.decode()] = value
        self._live = live
        return live

    def __getitem__(self, key: str) -> V:
        with self._lock:
            return self._view()[key]

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._view()

    def get(self, key: str, default: Any = None) -> Any:
        # Mapping.get would go through __getitem__ and a KeyError for every key not held: most
        # lookups (each new request's) miss.
        with self._lock:
            return self._view().get(key, default)

    def __setitem__(self, key: str, value: V) -> None:
        k = key.encode()
        with self._lock:
            self._pending[k] = (self._partition_for(k), value)
            self._view()[key] = value

    def __delitem__(self, key: str) -> None:
        k = key.encode()
        with self._lock:
            view = self._view()
            if key not in view:
                raise KeyError(key)
            self._pending[k] = (self._partition_for(k), _DELETED)
            del view[key]

    def items(self) -> Any:
        """Every (key, value), without per-key lookups (expiry scans every entry). A live view:
        like a dict's, do not write while iterating it (the processor's lock keeps other threads
        out; ``flush`` never changes it)."""
        with self._lock:
            return self._view().items()

    def values(self) -> list[V]:  # type: ignore[override]
        with self._lock:
            return list(self._view().values())

    def __iter__(self) -> Iterator[str]:
        with self._lock:
            return iter(list(self._view()))

    def __len__(self) -> int:
        with self._lock:
            return len(self._view())

    def _partition_for(self, key: bytes) -> int:
        """The changelog partition of a write; raised here, on the processor's thread, when
        unknown, so the adapter turns the record into a dead letter: an exception in ``flush``
        would crash the agent, and Faust acknowledges a crashed agent's batch (the state lost)."""
        if self.partition is not None:
            return self.partition
        if self.batch_partitions is not None and (partition := self.batch_partitions.get(key)) is not None:
            return partition
        # A write outside a batch or partition group (expiry): the partition the key was last written to
        # in this batch, before it, or recovered from (the memory store remembers that).
        for written in (self._pending, self._sealed):
            if key in written:
                return written[key][0]
        if key in self._partition_of:
            return self._partition_of[key]
        recovered = getattr(self.table.data, "_key_partition", {})
        if key in recovered:
            return int(recovered[key])
        raise RuntimeError(f"no changelog partition for table key {key!r}: written outside a batch's records and partition groups")

    def seal(self) -> int:
        """Encode the batch's writes, once per key (processor thread, after the batch); returns how many."""
        with self._lock:
            pending, self._pending = self._pending, {}
            encode = self.spec.encode
            for key, (partition, value) in pending.items():
                if value is _DELETED:
                    self._sealed[key] = (partition, None)
                else:
                    raw = encode(value)
                    self._sealed[key] = (partition, raw)
                    self._decoded[key] = (raw, value)
        return len(pending)

    # --- flush (event loop) --------------------------------------------------------------------
    def flush(self, unsealed: bool = True) -> int:
        """Apply the sealed writes (and, unless ``unsealed`` is false, the pending ones) to the table
        and send them to its changelog with ``table.send_changelog``; returns how many."""
        records = self.drain(unsealed)
        for partition, key, raw in records:
            self.table.send_changelog(partition, key, raw, key_serializer="raw", value_serializer="raw")
        return len(records)

    def drain(self, unsealed: bool = True) -> list[tuple[int, bytes, bytes | None]]:
        """Apply the sealed writes (and, unless ``unsealed`` is false, the pending ones) to the
        table's store; return the changelog records they make, one per key: (partition, key, value
        or None for a tombstone). The caller sends them before the batch is acknowledged.

        The adapter passes ``unsealed=False``: a write still pending belongs to a batch another
        thread is processing, and its value may still change."""
        with self._lock:
            if unsealed:
                self.seal()
            sealed, self._sealed = self._sealed, {}
            store = self.table.data
            key_partition = getattr(store, "_key_partition", None)
            records: list[tuple[int, bytes, bytes | None]] = []
            for key, (partition, raw) in sealed.items():
                if raw is None:
                    store.pop(key, None)
                    self._partition_of.pop(key, None)
                    self._decoded.pop(key, None)
                    if key_partition is not None:
                        key_partition.pop(key, None)
                else:
                    store_raw(store, key, raw, partition)
                    self._partition_of[key] = partition
                records.append((partition, key, raw))
        return records


def store_raw(store: Any, key: bytes, raw: bytes, partition: int) -> None:
    """Write ``raw`` under ``key`` into a Faust table's store, with its changelog partition: the
    memory store drops keys of revoked partitions after a rebalance only if it knows their
    partition, and it learns that only from recovery."""
    store[key] = raw
    key_partition = getattr(store, "_key_partition", None)
    if key_partition is not None:
        key_partition[key] = partition


__all__ = ["TableState", "TableStateSpec", "store_raw"]
