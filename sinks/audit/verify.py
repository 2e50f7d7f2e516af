"""Recompute the audit log's tamper evidence and name every problem found.

Checks, per chain (one per partition of each logged topic: the audit topic and the actions topic),
manifests taken in offset order:

* each manifest parses, and its content belongs at its key (chain and offsets) — else *reordered*;
* its ``seq`` follows the previous one — a jump is a *missing* batch, a repeat an *inserted* one;
* its ``prev_manifest_sha256`` is the SHA-256 of the previous manifest's bytes — else *broken_chain*;
* its Merkle root is recomputed from its files' hashes — else *modified* (the manifest);
* each file it names exists (*missing*) and hashes to the recorded SHA-256: a file whose bytes
  are those of another file of the log is *reordered* (swapped or moved), otherwise *modified*;
* the newest head names the last manifest with its hash: a head ahead of the manifests means the
  tail is *missing*, manifests beyond the head are *unsealed*, a head whose hash differs means the
  manifest was *modified*; older heads must agree with the chain too;
* every object under ``audit/``, ``actions/`` or ``manifests/`` that no chain names is *inserted*.

All of the above is internal consistency: someone who can write the folder can drop the newest
batch with its head, delete a chain, or rewrite history with recomputed hashes, and every check
still passes. Given the signed checkpoints read from outside the folder (``checkpoints``,
``anchors``), the log is also held against the union of every valid one:

* a signed head whose batch is gone is *truncated*; a signed chain with nothing left is *missing*;
* a signed head whose manifest hash differs from the log's is *rewritten*;
* batches (or whole chains) beyond every signed head are *unanchored*: appended by someone without
  the key, or written after the newest checkpoint (with checkpoints every N > 1 batches);
* a checkpoint whose signature fails is *bad_checkpoint*; anchors given but no valid checkpoint in
  them is *no_checkpoint*.

Without checkpoints the report says that only internal consistency was checked.

Files are hashed once each, streaming through SHA-256 at storage speed; nothing is decoded, so
verification scales with bytes, not records.
"""

from __future__ import annotations

import hashlib
import time
from collections import defaultdict
from dataclasses import dataclass, field

from entroloop.infra.worm.checkpoints import CheckpointSet
from entroloop.infra.worm.manifest import (
    DATA_PREFIXES,
    HEAD_PREFIX,
    MANIFEST_PREFIX,
    Head,
    Manifest,
    merkle_root,
    parse_manifest_key,
)
from entroloop.infra.worm.worm_store import WormStore

PROBLEM_KINDS = ("modified", "missing", "reordered", "inserted", "broken_chain", "unsealed",
                 "truncated", "rewritten", "unanchored", "bad_checkpoint", "no_checkpoint")


@dataclass(frozen=True)
class Problem:
    kind: str
    key: str
    detail: str

    def __str__(self) -> str:
        return f"{self.kind}: {self.key}: {self.detail}"


@dataclass
class VerifyReport:
    store: str
    chains: int = 0
    batches: int = 0
    files: int = 0
    records: int = 0
    bytes: int = 0
    seconds: float = 0.0
    problems: list[Problem] = field(default_factory=list)
    records_by_topic: dict[str, int] = field(default_factory=dict)
    """Records the manifests name, per topic (audit records and action records apart)."""
    anchor: dict[str, object] = field(default_factory=lambda: {"mode": "internal consistency only"})
    """What the log was held against: checkpoint sources, public key, the newest valid checkpoint."""

    @property
    def anchored(self) -> bool:
        return self.anchor.get("mode") == "signed checkpoints"

    @property
    def ok(self) -> bool:
        return not self.problems

    def kinds(self) -> set[str]:
        return {p.kind for p in self.problems}

    def as_dict(self) -> dict[str, object]:
        return {
            "store": self.store,
            "ok": self.ok,
            "chains": self.chains,
            "batches": self.batches,
            "files": self.files,
            "records": self.records,
            "bytes": self.bytes,
            "seconds": round(self.seconds, 3),
            "records_by_topic": dict(sorted(self.records_by_topic.items())),
            "anchor": self.anchor,
            "problems": [p.__dict__ for p in self.problems],
        }


def verify_store(store: WormStore, checkpoints: CheckpointSet | None = None) -> VerifyReport:
    """Verify every chain in ``store``, and against ``checkpoints`` when given (read from outside
    the store with a public key); the report lists each problem (empty when intact)."""
    started = time.perf_counter()
    report = VerifyReport(store.describe())
    problems = report.problems
    keys = store.list()
    data_keys = {k for k in keys if k.startswith(DATA_PREFIXES)}
    heads_by_chain: dict[str, list[str]] = defaultdict(list)
    for key in keys:
        if key.startswith(HEAD_PREFIX):
            heads_by_chain[key[len(HEAD_PREFIX) :].split("/", 1)[0]].append(key)
    manifests_by_chain: dict[str, list[tuple[int, str]]] = defaultdict(list)
    for key in keys:
        if key.startswith(MANIFEST_PREFIX):
            ref = parse_manifest_key(key)
            if ref is None:
                problems.append(Problem("inserted", key, "not a manifest key this writer makes"))
            else:
                manifests_by_chain[ref.chain].append((ref.first_offset, key))

    # Hash every data file once; remember which key each hash was found at (to spot swaps).
    file_sha: dict[str, str] = {}
    key_by_sha: dict[str, str] = {}
    for key in sorted(data_keys):
        data = store.get(key)
        digest = hashlib.sha256(data).hexdigest()
        file_sha[key] = digest
        key_by_sha.setdefault(digest, key)
        report.bytes += len(data)

    referenced: set[str] = set()
    expected_key_by_sha: dict[str, str] = {}  # hash a manifest records -> that file's key
    chains = sorted(set(manifests_by_chain) | set(heads_by_chain))
    parsed: dict[str, list[tuple[str, bytes, Manifest | None]]] = {}
    for chain in chains:
        entries = []
        for _, key in sorted(manifests_by_chain.get(chain, [])):
            data = store.get(key)
            try:
                manifest = Manifest.from_bytes(data)
            except Exception as exc:  # noqa: BLE001 - unreadable manifest: edited bytes
                problems.append(Problem("modified", key, f"manifest does not parse ({type(exc).__name__})"))
                manifest = None
            entries.append((key, data, manifest))
            if manifest:
                for f in manifest.files:
                    expected_key_by_sha.setdefault(f.sha256, f.key)
        parsed[chain] = entries

    ends: dict[str, tuple[int, dict[int, tuple[str, str]]]] = {}
    for chain in chains:
        report.chains += 1
        ends[chain] = _verify_chain(store, chain, parsed[chain], heads_by_chain.get(chain, []), file_sha,
                                    key_by_sha, expected_key_by_sha, referenced, report)
    if checkpoints is not None:
        _verify_against_checkpoints(checkpoints, ends, report)

    for key in sorted(data_keys - referenced):
        problems.append(Problem("inserted", key, "data file named by no manifest"))
    report.seconds = time.perf_counter() - started
    return report


def _verify_chain(
    store: WormStore,
    chain: str,
    entries: list[tuple[str, bytes, Manifest | None]],
    head_keys: list[str],
    file_sha: dict[str, str],
    key_by_sha: dict[str, str],
    expected_key_by_sha: dict[str, str],
    referenced: set[str],
    report: VerifyReport,
) -> tuple[int, dict[int, tuple[str, str]]]:
    """Check one chain; return its last batch number and seq -> (manifest key, sha256)."""
    problems = report.problems
    prev_sha, prev_seq, prev_last = "", -1, -1
    seq_to_sha: dict[int, tuple[str, str]] = {}
    for key, data, manifest in entries:
        digest = hashlib.sha256(data).hexdigest()
        report.batches += 1
        if manifest is None:
            prev_sha, prev_seq = digest, prev_seq + 1
            continue
        ref = parse_manifest_key(key)
        if (manifest.key != key) or (ref and ref.chain != manifest.chain):
            problems.append(Problem("reordered", key, f"holds the manifest of {manifest.key}"))
        if manifest.seq > prev_seq + 1:
            problems.append(Problem("missing", key, f"batches {prev_seq + 1}..{manifest.seq - 1} of {chain} are gone"))
        elif manifest.seq <= prev_seq:
            problems.append(Problem("inserted", key, f"batch number {manifest.seq} repeats or goes back (after {prev_seq})"))
        if manifest.prev_manifest_sha256 != prev_sha:
            problems.append(Problem("broken_chain", key, "previous-manifest hash does not match the manifest before it"))
        if manifest.first_offset <= prev_last:
            problems.append(Problem("reordered", key, f"offsets {manifest.first_offset}.. go back before {prev_last}"))
        report.records_by_topic[manifest.topic] = report.records_by_topic.get(manifest.topic, 0) + sum(
            f.records for f in manifest.files
        )
        if merkle_root([f.sha256 for f in manifest.files]) != manifest.merkle_root:
            problems.append(Problem("modified", key, "Merkle root does not match the file hashes it lists"))
        for f in manifest.files:
            referenced.add(f.key)
            report.files += 1
            report.records += f.records
            actual = file_sha.get(f.key)
            if actual is None:
                problems.append(Problem("missing", f.key, f"named by {key}, not in the store"))
            elif actual != f.sha256:
                owner = expected_key_by_sha.get(actual)  # whose bytes this file now holds
                moved_to = key_by_sha.get(f.sha256)  # where this file's own bytes are now
                if owner is not None and owner != f.key:
                    problems.append(Problem("reordered", f.key, f"holds the bytes of {owner}"))
                elif moved_to is not None and moved_to != f.key:
                    problems.append(Problem("reordered", f.key, f"its bytes are now at {moved_to}"))
                else:
                    problems.append(Problem("modified", f.key, "SHA-256 differs from its manifest"))
        seq_to_sha[manifest.seq] = (key, digest)
        prev_sha, prev_seq, prev_last = digest, manifest.seq, manifest.last_offset

    if not head_keys:
        if entries:
            problems.append(Problem("unsealed", f"{HEAD_PREFIX}{chain}/", "chain has manifests but no head"))
        return prev_seq, seq_to_sha
    heads = []
    for key in sorted(head_keys):
        try:
            heads.append((key, Head.from_bytes(store.get(key))))
        except Exception as exc:  # noqa: BLE001 - an unreadable head is a finding, not a crash
            problems.append(Problem("modified", key, f"head does not parse ({type(exc).__name__})"))
    for key, head in heads:
        recorded = seq_to_sha.get(head.seq)
        if head.chain != chain or key != head.key:
            problems.append(Problem("reordered", key, f"holds the head of {head.key}"))
        elif recorded is None:
            problems.append(Problem("missing", head.manifest_key, f"head {key} names batch {head.seq}, which is gone"))
        elif recorded != (head.manifest_key, head.manifest_sha256):
            problems.append(Problem("modified", head.manifest_key, f"manifest hash differs from the one sealed in {key}"))
    if heads:
        newest = max(heads, key=lambda h: h[1].seq)[1]
        if prev_seq > newest.seq:
            problems.append(Problem("unsealed", chain, f"batches {newest.seq + 1}..{prev_seq} are beyond the newest head"))
    return prev_seq, seq_to_sha


def _verify_against_checkpoints(
    checkpoints: CheckpointSet, ends: dict[str, tuple[int, dict[int, tuple[str, str]]]], report: VerifyReport
) -> None:
    """Hold every chain against the signed heads of every valid checkpoint (see the module doc)."""
    problems = report.problems
    report.anchor = checkpoints.describe()
    for where, why in checkpoints.invalid:
        problems.append(Problem("bad_checkpoint", where, why))
    if not checkpoints.valid:
        sources = ", ".join(checkpoints.sources + checkpoints.source_errors) or "none readable"
        problems.append(Problem("no_checkpoint", "checkpoints", f"no valid signed checkpoint in: {sources}"))
        return
    pins = checkpoints.pins()
    for chain, by_seq in sorted(pins.items()):
        top = max(by_seq)
        if chain not in ends:
            problems.append(Problem("missing", chain, f"the whole chain is gone; a signed checkpoint holds it at batch {top}"))
            continue
        last, seq_to_sha = ends[chain]
        for seq, signed in sorted(by_seq.items()):
            recorded = seq_to_sha.get(seq)
            if recorded is None:
                if seq > last:
                    problems.append(Problem("truncated", chain, f"the log ends at batch {last}; a signed checkpoint holds batch {seq}"))
                    break  # the later pins of this chain say the same
                problems.append(Problem("missing", chain, f"batch {seq}, signed in a checkpoint, is gone"))
            elif recorded not in signed:
                problems.append(Problem("rewritten", recorded[0], f"manifest of batch {seq} differs from the one a signed checkpoint holds"))
        if last > top:
            problems.append(Problem("unanchored", chain, f"batches {top + 1}..{last} are covered by no signed checkpoint (appended without the key?)"))
    for chain in sorted(set(ends) - set(pins)):
        last, _ = ends[chain]
        if last >= 0:
            problems.append(Problem("unanchored", chain, f"chain with batches 0..{last} appears in no signed checkpoint"))
