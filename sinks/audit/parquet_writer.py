"""Audit and action records -> write-once Parquet files, a hash-chained manifest per batch, a chain head.

Object keys are derived from the batch's (topic, partition, first offset, last offset), so a batch
redelivered after a crash maps to the same keys and is recognised instead of written twice.
Each logged topic has its layout (``entroloop.infra.worm.layouts``): audit records are partitioned by model
and day (``audit/model=M/day=YYYY-MM-DD/``) so an auditor's question about one model and one day
touches few files; action records by action and day (``actions/action=A/day=YYYY-MM-DD/``). The
tamper evidence (SHA-256 per file, Merkle root per batch, manifests chained per topic partition,
heads) is described in ``entroloop.infra.worm.manifest``; the audit and action topics have chains of their own.

A record whose event id the writer stored lately (``entroloop.sinks.recent_ids``: a publisher's spool replay
re-sent it at another offset) is left out of the batch's files; the batch's manifest still covers
its offsets, so the chain has no gap. The memory outlives a restart in part: opening a chain reads
back the ids of its newest ``seed_batches`` sealed batches (``entroloop.sinks.audit.stored_ids``).

With a ``Checkpointer`` (``ENTROLOOP_AUDIT_SIGNING_KEY_FILE``), the heads are signed after sealing
and kept outside the log (``entroloop.sinks.audit.checkpointer``), so ``verify`` can tell the log that was
written from a consistent rewrite of it.

Write order is data files, then the manifest, then the head: a crash at any point leaves objects
that a retry recreates byte for byte (``put_once`` recognises them) or, when the retry filters other
records (the recent-id memory died with the process), a data file whose rows are all this batch's:
it is chained and the records it lacks are written beside it (``_put_group``). A manifest written
without its head is adopted and sealed the next time the writer opens that chain.
"""

from __future__ import annotations

import io
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq
from entroloop.sinks.audit.checkpointer import Checkpointer
from entroloop.sinks.audit.stored_ids import SEED_BATCHES, chained_event_ids
from entroloop.sinks.recent_ids import RecentEventIds

from entroloop.contract.records import Audit, Event
from entroloop.contract.topics import TOPIC_BY_NAME
from entroloop.infra.worm.checkpoints import AnchoredHead
from entroloop.infra.worm.layouts import (
    ACTION_SCHEMA,
    AUDIT_LAYOUT,
    AUDIT_SCHEMA,
    LOGGED_TOPICS,
    RecordLayout,
    layout_for,
)
from entroloop.infra.worm.manifest import (
    HEAD_PREFIX,
    MANIFEST_PREFIX,
    FileEntry,
    Head,
    Manifest,
    batch_name,
    chain_name,
    manifest_key,
    merkle_root,
    parse_manifest_key,
    sha256_hex,
)
from entroloop.infra.worm.parquet_bytes import read_parquet
from entroloop.infra.worm.worm_store import ObjectExists, WormStore

WrittenFile = FileEntry  # the name the first writer used


class AuditChainError(RuntimeError):
    """The stored chain cannot be extended safely (tampered, or a batch overlaps a written one)."""


def audit_table(records: Sequence[Audit]) -> pa.Table:
    """Audit records -> an Arrow table of ``AUDIT_SCHEMA`` (see ``RecordLayout.table``)."""
    return AUDIT_LAYOUT.table(records)


def parquet_bytes(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd", write_statistics=True)
    return buf.getvalue()


@dataclass
class ChainState:
    """Where one topic partition's chain ends, and which batches it already holds."""

    seq: int = -1
    last_offset: int = -1
    manifest_key: str = ""
    manifest_sha256: str = ""
    batches: set[str] = field(default_factory=set)


class AuditParquetWriter:
    """Writes each batch of a logged topic (audit or actions) once and chains it; counts files
    written and redeliveries recognised. One writer serves every logged topic: the schema and the
    folders come from the topic's layout, the chain from its (topic, partition)."""

    def __init__(
        self, store: WormStore, topics: Iterable[str] = LOGGED_TOPICS, checkpointer: Checkpointer | None = None,
        seed_batches: int = SEED_BATCHES,
    ) -> None:
        self.store = store
        self.seed_batches = seed_batches
        self.checkpointer = checkpointer
        self.topics: tuple[str, ...] = tuple(topics)
        for topic in self.topics:
            layout_for(topic)  # an unknown topic fails here, not at its first batch
        self.files_written = 0
        self.files_skipped = 0
        self.records_written = 0
        self.bytes_written = 0
        self.batches_written = 0
        self.batches_skipped = 0
        self._chains: dict[str, ChainState] = {}
        self.recent = RecentEventIds()

    # --- chain state -----------------------------------------------------------------------------
    def chain(self, topic: str, partition: int) -> ChainState:
        """The chain of ``topic``/``partition`` as stored: loaded once, then kept in memory."""
        name = chain_name(topic, partition)
        if name not in self._chains:
            # the memory of recent ids is shared: each partition's chain seeds its share of it
            self._chains[name] = self._load_chain(name, self.recent.capacity // TOPIC_BY_NAME[topic].partitions)
        return self._chains[name]

    def _load_chain(self, name: str, seed_ids: int) -> ChainState:
        state = ChainState()
        heads = self.store.list(f"{HEAD_PREFIX}{name}/")
        if heads:
            head = Head.from_bytes(self.store.get(max(heads)))
            state = ChainState(head.seq, head.last_offset, head.manifest_key, head.manifest_sha256)
        manifests = []
        for key in self.store.list(f"{MANIFEST_PREFIX}{name}-"):
            ref = parse_manifest_key(key)
            if ref and ref.chain == name:
                state.batches.add(key)
                if ref.first_offset > state.last_offset:
                    manifests.append((ref.first_offset, key))
        for _, key in sorted(manifests):  # written before a crash, head missing: adopt and seal
            data = self.store.get(key)
            manifest = Manifest.from_bytes(data)
            if manifest.prev_manifest_sha256 != state.manifest_sha256 or manifest.seq != state.seq + 1:
                raise AuditChainError(f"{key} does not extend the chain {name} at batch {state.seq}; run `entroloop audit verify`")
            self._seal(manifest, sha256_hex(data), state)
        if self.seed_batches and state.manifest_key:  # copies of what another process stored here
            self.recent.remember_ids(chained_event_ids(
                self.store, state.manifest_key, state.manifest_sha256, self.seed_batches, limit=seed_ids))
        return state

    def _seal(self, manifest: Manifest, manifest_sha: str, state: ChainState) -> None:
        head = Head(manifest.chain, manifest.seq, manifest.key, manifest_sha, manifest.last_offset)
        self.store.put_once(head.key, head.to_bytes())
        state.seq, state.last_offset = manifest.seq, manifest.last_offset
        state.manifest_key, state.manifest_sha256 = manifest.key, manifest_sha
        state.batches.add(manifest.key)

    # --- writing ---------------------------------------------------------------------------------
    def _put_group(self, layout: RecordLayout, key: str, group: list[Event],
                   batch_records: Sequence[Event]) -> list[FileEntry]:
        """Store one folder's records of a batch at ``key`` once; the entries of the files that hold them.

        The key may hold an earlier attempt of this batch (same offsets): a crash came between its
        data files and its manifest. That attempt may have left out other records than this one (the
        recent-id memory that filters spool replays dies with the process), and may have used other
        bytes (another Parquet library). Its file is chained when every row of it is a record of this
        batch, and this group's records it lacks go to a second file (``<batch>.rest.parquet``, under the
        same rule: a retry may find it written already, with more or fewer of the batch's records).
        Anything else at the key was planted there: refused, never chained. So an intruder who can
        write to the store can neither forge a record nor, by planting a subset, hide one.
        """
        table = layout.table(group)
        data = parquet_bytes(table)
        try:
            created = self.store.put_once(key, data)
        except ObjectExists:
            existing = self.store.get(key)
            held = self._earlier_attempt(layout, key, existing, batch_records)
            self.files_skipped += 1
            entries = [FileEntry(key, sha256_hex(existing), len(held), len(existing))]
            missing = [r for r in group if r.event_id not in held]
            if missing:
                entries += self._put_group(layout, key.removesuffix(".parquet") + ".rest.parquet", missing,
                                          batch_records)
            return entries
        if created:
            self.files_written += 1
            self.bytes_written += len(data)
        else:
            self.files_skipped += 1
        return [FileEntry(key, sha256_hex(data), len(group), len(data))]

    @staticmethod
    def _earlier_attempt(layout: RecordLayout, key: str, existing: bytes,
                         batch_records: Sequence[Event]) -> set[str]:
        """The event ids the object at ``key`` holds, if each of its rows equals a record of this
        batch (all columns); else ``AuditChainError``."""
        stored = read_parquet(existing)
        by_id = {r.event_id: r for r in batch_records}
        ids = [str(i) for i in stored.column("event_id").to_pylist()] if "event_id" in stored.column_names else None
        if ids is None or any(i not in by_id for i in ids) \
                or not stored.equals(layout.table([by_id[i] for i in ids])):
            raise AuditChainError(f"{key} already exists with other records than this batch; "
                                  "refusing to chain it (run `entroloop audit verify`)")
        return set(ids)

    def write(
        self, topic: str, partition: int, first_offset: int, last_offset: int, records: Sequence[Event]
    ) -> list[FileEntry]:
        """Write the batch read at ``first_offset..last_offset``; a batch already chained is skipped."""
        if topic not in self.topics:
            raise ValueError(f"this writer logs {', '.join(self.topics)}, not {topic!r}")
        layout = layout_for(topic)
        strays = {type(r).__name__ for r in records if type(r) is not layout.record_type}
        if strays:  # the schema would silently miss their fields
            raise TypeError(f"{topic} holds {layout.record_type.__name__} records, not {', '.join(sorted(strays))}")
        state = self.chain(topic, partition)
        key = manifest_key(topic, partition, first_offset, last_offset)
        if key in state.batches or last_offset <= state.last_offset:
            self.batches_skipped += 1  # redelivered: its records are in the chain already
            if self.checkpointer is not None and key == state.manifest_key:
                # the newest batch again: the writer before may have died between its head and its checkpoint
                self.checkpointer.checkpoint(self.anchored_heads())
            return []
        if first_offset <= state.last_offset:
            raise AuditChainError(
                f"batch {first_offset}-{last_offset} of {topic}[{partition}] overlaps the chained "
                f"offsets up to {state.last_offset}; batches must be cut at the same offsets on redelivery"
            )
        fresh = self.recent.unseen(records)
        groups: dict[str, list[Event]] = defaultdict(list)
        for r in fresh:
            groups[layout.folder(r)].append(r)
        batch = batch_name(topic, partition, first_offset, last_offset)
        files = []
        for folder, group in sorted(groups.items()):
            files += self._put_group(layout, f"{folder}/{batch}.parquet", group, records)
            self.records_written += len(group)
        files.sort(key=lambda f: f.key)
        manifest = Manifest(
            topic=topic,
            partition=partition,
            first_offset=first_offset,
            last_offset=last_offset,
            seq=state.seq + 1,
            files=tuple(files),
            merkle_root=merkle_root([f.sha256 for f in files]),
            prev_manifest_key=state.manifest_key,
            prev_manifest_sha256=state.manifest_sha256,
            records=sum(f.records for f in files),
        )
        data = manifest.to_bytes()
        self.store.put_once(manifest.key, data)
        self._seal(manifest, sha256_hex(data), state)
        self.recent.remember(fresh)
        self.batches_written += 1
        if self.checkpointer is not None:  # after the head is durable: never vouch for a batch that could be lost
            self.checkpointer.batch_sealed(self.anchored_heads())
        return files

    # --- anchoring -------------------------------------------------------------------------------
    def anchored_heads(self) -> list[AnchoredHead]:
        """The head of every chain this writer holds, as a checkpoint signs it."""
        return [
            AnchoredHead(name, state.seq, state.last_offset, state.manifest_key, state.manifest_sha256)
            for name, state in sorted(self._chains.items())
            if state.seq >= 0
        ]

    def close(self) -> None:
        """Sign the batches sealed since the last checkpoint (with checkpoints every N > 1 batches)."""
        if self.checkpointer is not None:
            self.checkpointer.close(self.anchored_heads())


__all__ = [
    "ACTION_SCHEMA",
    "AUDIT_SCHEMA",
    "AuditChainError",
    "AuditParquetWriter",
    "ChainState",
    "audit_table",
    "parquet_bytes",
]
