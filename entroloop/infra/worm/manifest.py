"""Batch manifests, their hash chain and chain heads: the audit log's tamper evidence.

Every batch of a logged topic (one topic partition, offsets ``first..last``) is written as one
Parquet file per partition value and day plus a manifest naming each file with its SHA-256, the
Merkle root over those hashes, and the SHA-256 of the previous manifest of the same partition. One
chain per topic partition: partitions have one writer each (Kafka assigns them), so chains never
contend, and the audit topic's chains and the actions topic's chains never mix.

Object keys (all derived from the batch, so a redelivery maps to the same keys)::

    audit/model=M/day=YYYY-MM-DD/<batch>.parquet     audit records (entroloop.audit.v1)
    actions/action=A/day=YYYY-MM-DD/<batch>.parquet  action records (entroloop.actions.v1)
    manifests/<batch>.json                           one per batch; sorts by offset within a chain
    heads/<chain>/<seq>.json                         the chain head after batch number <seq>
    checkpoints/<time>-<writer>-<n>.json             signed checkpoints of the heads (S3 store only,
                                                     COMPLIANCE-locked; see ``checkpoints``/``anchors``)

``<batch>`` = ``<topic>-pPPP-<first:012d>-<last:012d>``, ``<chain>`` = ``<topic>-pPPP``.

Why heads are new objects instead of one updated "head" key: write-once storage cannot update a
key (a locked S3 object version can't be overwritten and a local 0444 file is linked exclusively),
so the head after batch ``seq`` is its own write-once object and the current head is the one with
the highest ``seq``. This works the same on the local store and on S3 without relying on bucket
versioning semantics, and older heads remain as evidence of the chain's earlier states.

Heads live in the same folder as the log, so they prove consistency, not authenticity: someone
who can write the folder can truncate, delete or rewrite a chain and recompute every head. Signed
checkpoints kept outside the folder (``checkpoints``, ``anchors``) close that gap.

Manifests hold no timestamps: rebuilt from the same batch they are byte-identical, so writing
one again after a crash is recognised by ``put_once`` as a redelivery.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import asdict, dataclass, field

MANIFEST_VERSION = 1
DATA_PREFIX = "audit/"
ACTION_DATA_PREFIX = "actions/"
DATA_PREFIXES = (DATA_PREFIX, ACTION_DATA_PREFIX)
"""Every prefix that holds record files: the verifier treats a file under one that no manifest names
as inserted."""
MANIFEST_PREFIX = "manifests/"
HEAD_PREFIX = "heads/"

_BATCH_RE = re.compile(r"(?P<chain>(?P<topic>.+)-p(?P<partition>\d{3}))-(?P<first>\d{12})-(?P<last>\d{12})")


def safe_name(value: str) -> str:
    """``value`` usable as one path segment of an object key."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in value) or "_"


def chain_prefix(topic: str) -> str:
    """The start of every manifest key of ``topic``'s chains (all its partitions)."""
    return f"{MANIFEST_PREFIX}{safe_name(topic)}-p"


def chain_name(topic: str, partition: int) -> str:
    return f"{safe_name(topic)}-p{partition:03d}"


def batch_name(topic: str, partition: int, first_offset: int, last_offset: int) -> str:
    return f"{chain_name(topic, partition)}-{first_offset:012d}-{last_offset:012d}"


def manifest_key(topic: str, partition: int, first_offset: int, last_offset: int) -> str:
    return f"{MANIFEST_PREFIX}{batch_name(topic, partition, first_offset, last_offset)}.json"


def head_key(chain: str, seq: int) -> str:
    return f"{HEAD_PREFIX}{chain}/{seq:012d}.json"


@dataclass(frozen=True)
class BatchRef:
    """What a manifest key says about its batch: chain and offsets (checked against the content)."""

    chain: str
    first_offset: int
    last_offset: int


def parse_manifest_key(key: str) -> BatchRef | None:
    if not (key.startswith(MANIFEST_PREFIX) and key.endswith(".json")):
        return None
    match = _BATCH_RE.fullmatch(key[len(MANIFEST_PREFIX) : -len(".json")])
    if not match:
        return None
    return BatchRef(match["chain"], int(match["first"]), int(match["last"]))


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def merkle_root(leaf_hashes: list[str]) -> str:
    """Merkle root over hex SHA-256 leaves, in the given order (RFC 6962 style domain separation).

    Leaves are hashed with a 0x00 prefix and inner nodes with 0x01, so a leaf can never pose as an
    inner node; an odd node at the end of a level is carried up unchanged. The empty tree's root
    is SHA-256 of nothing.
    """
    if not leaf_hashes:
        return hashlib.sha256(b"").hexdigest()
    level = [hashlib.sha256(b"\x00" + bytes.fromhex(h)).digest() for h in leaf_hashes]
    while len(level) > 1:
        nxt = [hashlib.sha256(b"\x01" + level[i] + level[i + 1]).digest() for i in range(0, len(level) - 1, 2)]
        if len(level) % 2:
            nxt.append(level[-1])
        level = nxt
    return level[0].hex()


@dataclass(frozen=True)
class FileEntry:
    key: str
    sha256: str
    records: int
    bytes: int


@dataclass(frozen=True)
class Manifest:
    topic: str
    partition: int
    first_offset: int
    last_offset: int
    seq: int
    files: tuple[FileEntry, ...]
    merkle_root: str
    prev_manifest_key: str = ""
    prev_manifest_sha256: str = ""
    version: int = MANIFEST_VERSION
    records: int = field(default=0)

    @property
    def chain(self) -> str:
        return chain_name(self.topic, self.partition)

    @property
    def key(self) -> str:
        return manifest_key(self.topic, self.partition, self.first_offset, self.last_offset)

    def to_bytes(self) -> bytes:
        body = asdict(self)
        body["files"] = [asdict(f) for f in self.files]
        return json.dumps(body, sort_keys=True, indent=1).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        body = json.loads(data)
        body["files"] = tuple(FileEntry(**f) for f in body["files"])
        return cls(**body)


@dataclass(frozen=True)
class Head:
    """The chain ``chain`` ends, after batch number ``seq``, at ``manifest_key`` with this hash."""

    chain: str
    seq: int
    manifest_key: str
    manifest_sha256: str
    last_offset: int

    @property
    def key(self) -> str:
        return head_key(self.chain, self.seq)

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, indent=1).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Head:
        return cls(**json.loads(data))
