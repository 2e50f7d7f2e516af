"""Signed checkpoints of the audit log's chain heads: what anchors the log outside its folder.

Hash chains and heads (``manifest``) prove that the log is *consistent*, not that it is the log
that was written: whoever can write the folder can drop the newest batch with its head, delete a
whole chain, or rewrite history and recompute every hash, Merkle root and head, and the chain is
consistent again. A checkpoint closes that gap. After sealing batches the writer signs, with an
Ed25519 private key that lives outside the data folder, the heads of its chains::

    {"log": ..., "heads": [{chain, seq, last_offset, manifest_key, manifest_sha256}, ...],
     "batches": <running count: batches chained in the heads it names>,
     "created_at": <unix time>, "writer": <writer instance>, "number": <n-th of that writer>,
     "key_fingerprint": <SHA-256 of the public key>}

and stores it somewhere else (``anchors``: ClickHouse ``audit_checkpoints``, S3 objects under
``checkpoints/`` in COMPLIANCE mode, a folder on another mount). ``verify`` then holds the log
against the union of every valid checkpoint: each signed head must still be in the log with the
same manifest hash (else *truncated*/*rewritten*/a chain *missing*), and a batch that no signed
head covers is *unanchored* (a forged append). Without the private key none of this can be forged;
without write access to the anchor none of it can be deleted.

A signed head pins its manifest by SHA-256, and every manifest pins its predecessor, so one signed
head covers its whole chain up to it: ``covered_files`` walks that link back to answer "is this
record's file part of a signed log?" without reading the data files.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from dataclasses import asdict, dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import (
    Ed25519PrivateKey,
    Ed25519PublicKey,
)

from entroloop.infra.worm.manifest import Manifest, sha256_hex
from entroloop.infra.worm.s3_store import S3Unavailable
from entroloop.infra.worm.worm_store import WormStore

CHECKPOINT_VERSION = 1
CHECKPOINT_PREFIX = "checkpoints/"
PRIVATE_KEY_NAME = "audit_signing_key.pem"
PUBLIC_KEY_NAME = "audit_signing_key.pub.pem"


class CheckpointInvalid(ValueError):
    """A checkpoint document that does not parse or whose signature does not verify."""


class KeyFileError(ValueError):
    """A signing or public key file that is missing, unsafe (readable by others) or not Ed25519."""


# --- keys ----------------------------------------------------------------------------------------
def key_fingerprint(public_key: Ed25519PublicKey) -> str:
    """``SHA256:<hex>`` of the raw 32-byte public key: what reports print to name the key."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "SHA256:" + hashlib.sha256(raw).hexdigest()[:32]


def generate_key_pair(out_dir: Path) -> tuple[Path, Path]:
    """Write a new Ed25519 key pair into ``out_dir``: the private key 0600 (created exclusively, so
    an existing key is never overwritten), the public key 0644. Returns (private, public) paths."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True, mode=0o700)
    private_path, public_path = out_dir / PRIVATE_KEY_NAME, out_dir / PUBLIC_KEY_NAME
    key = Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    public_pem = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    try:
        fd = os.open(private_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        raise KeyFileError(f"{private_path} already exists; it is never overwritten (choose another --out)") from None
    with os.fdopen(fd, "wb") as fh:
        fh.write(private_pem)
    os.chmod(private_path, 0o600)  # whatever the umask was
    public_path.write_bytes(public_pem)
    os.chmod(public_path, 0o644)
    return private_path, public_path


def load_private_key(path: Path) -> Ed25519PrivateKey:
    """The Ed25519 private key in ``path``; refused if group or others may read it (like ssh)."""
    path = Path(path)
    try:
        mode = path.stat().st_mode
        data = path.read_bytes()
    except OSError as exc:
        raise KeyFileError(f"ENTROLOOP_AUDIT_SIGNING_KEY_FILE: cannot read {path}: {exc.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise KeyFileError(
            f"ENTROLOOP_AUDIT_SIGNING_KEY_FILE: {path} is accessible by group or others "
            f"(mode {stat.S_IMODE(mode):04o}); run `chmod 600 {path}`"
        )
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"ENTROLOOP_AUDIT_SIGNING_KEY_FILE: {path} is not an unencrypted PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise KeyFileError(f"ENTROLOOP_AUDIT_SIGNING_KEY_FILE: {path} is not an Ed25519 key (`entroloop audit keygen` makes one)")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    """The Ed25519 public key in ``path`` (PEM, as ``entroloop audit keygen`` writes it)."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise KeyFileError(f"public key {path}: {exc.strerror}") from None
    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise KeyFileError(f"public key {path} is not a PEM public key ({exc})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise KeyFileError(f"public key {path} is not an Ed25519 key")
    return key


# --- the document --------------------------------------------------------------------------------
@dataclass(frozen=True)
class AnchoredHead:
    """One chain's head as signed: batch number ``seq`` ends at ``manifest_key`` with this hash."""

    chain: str
    seq: int
    last_offset: int
    manifest_key: str
    manifest_sha256: str


@dataclass(frozen=True)
class Checkpoint:
    log: str
    heads: tuple[AnchoredHead, ...]
    batches: int
    created_at: float
    writer: str
    number: int
    key_fingerprint: str
    version: int = CHECKPOINT_VERSION

    @property
    def name(self) -> str:
        """File / object name: sorts by time, unique per writer instance and number."""
        return f"{int(self.created_at * 1e6):020d}-{self.writer}-{self.number:08d}.json"

    def payload(self) -> bytes:
        """The signed bytes: canonical JSON (sorted keys, no spaces), so any edit breaks the signature."""
        body = asdict(self)
        body["heads"] = [asdict(h) for h in self.heads]
        return json.dumps(body, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_payload(cls, payload: bytes) -> Checkpoint:
        body = json.loads(payload)
        body["heads"] = tuple(AnchoredHead(**h) for h in body["heads"])
        return cls(**body)


def sign_checkpoint(checkpoint: Checkpoint, key: Ed25519PrivateKey) -> bytes:
    """The stored document: the payload verbatim (base of the signature) and the signature."""
    payload = checkpoint.payload()
    doc = {"payload": payload.decode(), "signature": key.sign(payload).hex()}
    return json.dumps(doc, sort_keys=True, indent=1).encode()


def open_checkpoint(document: bytes, public_key: Ed25519PublicKey) -> Checkpoint:
    """The checkpoint in ``document`` if its signature verifies under ``public_key``, else
    ``CheckpointInvalid`` saying why."""
    try:
        doc = json.loads(document)
        payload = doc["payload"].encode()
        signature = bytes.fromhex(doc["signature"])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise CheckpointInvalid(f"not a checkpoint document ({type(exc).__name__})") from None
    try:
        public_key.verify(signature, payload)
    except InvalidSignature:
        raise CheckpointInvalid(f"signature does not verify under key {key_fingerprint(public_key)}") from None
    try:
        return Checkpoint.from_payload(payload)
    except (ValueError, KeyError, TypeError) as exc:  # signed but malformed: a writer bug, still not evidence
        raise CheckpointInvalid(f"signed payload does not parse ({type(exc).__name__})") from None


class CheckpointSigner:
    """Signs checkpoints of one log for one writer instance (``writer`` + a running ``number``)."""

    def __init__(self, key: Ed25519PrivateKey, log: str, writer: str) -> None:
        self.key = key
        self.log = log
        self.writer = writer
        self.fingerprint = key_fingerprint(key.public_key())
        self.number = 0

    def sign(self, heads: list[AnchoredHead], created_at: float) -> tuple[Checkpoint, bytes]:
        self.number += 1
        checkpoint = Checkpoint(
            log=self.log,
            heads=tuple(sorted(heads, key=lambda h: h.chain)),
            batches=sum(h.seq + 1 for h in heads),
            created_at=created_at,
            writer=self.writer,
            number=self.number,
            key_fingerprint=self.fingerprint,
        )
        return checkpoint, sign_checkpoint(checkpoint, self.key)


# --- what verify holds the log against -----------------------------------------------------------
@dataclass(frozen=True)
class FoundCheckpoint:
    source: str
    checkpoint: Checkpoint


@dataclass
class CheckpointSet:
    """Every checkpoint read from the anchors, split into valid (signature verified, this log)
    and invalid (with the reason), plus where they were read from."""

    log: str
    public_key_fingerprint: str | None
    sources: list[str] = field(default_factory=list)
    source_errors: list[str] = field(default_factory=list)
    valid: list[FoundCheckpoint] = field(default_factory=list)
    invalid: list[tuple[str, str]] = field(default_factory=list)
    """(where, why) of each document that failed: a forged or edited checkpoint, or a wrong key."""

    @property
    def newest(self) -> FoundCheckpoint | None:
        return max(self.valid, key=lambda f: (f.checkpoint.created_at, f.checkpoint.batches), default=None)

    def pins(self) -> dict[str, dict[int, set[tuple[str, str]]]]:
        """chain -> seq -> {(manifest key, sha256)} over every valid checkpoint."""
        out: dict[str, dict[int, set[tuple[str, str]]]] = {}
        for found in self.valid:
            for h in found.checkpoint.heads:
                out.setdefault(h.chain, {}).setdefault(h.seq, set()).add((h.manifest_key, h.manifest_sha256))
        return out

    def coverage(self) -> dict[str, AnchoredHead]:
        """chain -> the highest signed head of that chain."""
        out: dict[str, AnchoredHead] = {}
        for found in self.valid:
            for h in found.checkpoint.heads:
                if h.chain not in out or h.seq > out[h.chain].seq:
                    out[h.chain] = h
        return out

    def describe(self) -> dict[str, object]:
        newest = self.newest
        return {
            "mode": "signed checkpoints" if newest else "internal consistency only",
            "public_key": self.public_key_fingerprint,
            "sources": list(self.sources),
            "source_errors": list(self.source_errors),
            "checkpoints_valid": len(self.valid),
            "checkpoints_invalid": len(self.invalid),
            "newest": None if newest is None else {
                "source": newest.source,
                "created_at": newest.checkpoint.created_at,
                "writer": newest.checkpoint.writer,
                "number": newest.checkpoint.number,
                "batches": newest.checkpoint.batches,
                "key_fingerprint": newest.checkpoint.key_fingerprint,
            },
        }


def collect_checkpoints(
    log: str, public_key: Ed25519PublicKey, documents: list[tuple[str, bytes]], sources: list[str]
) -> CheckpointSet:
    """Verify each (where, bytes) document; checkpoints of another log count as invalid here."""
    found = CheckpointSet(log, key_fingerprint(public_key), sources=list(sources))
    for where, document in documents:
        try:
            checkpoint = open_checkpoint(document, public_key)
        except CheckpointInvalid as exc:
            found.invalid.append((where, str(exc)))
            continue
        if checkpoint.log != log:
            found.invalid.append((where, f"checkpoint of log {checkpoint.log!r}, not {log!r}"))
            continue
        found.valid.append(FoundCheckpoint(where, checkpoint))
    return found


def covered_files(store: WormStore, checkpoints: CheckpointSet) -> dict[str, str]:
    """data file key -> SHA-256, for every file of a batch linked to a signed head.

    From each chain's highest signed head, walk the manifests back through their
    ``prev_manifest_sha256`` links, checking each manifest's bytes; a link that does not hold ends
    the walk, so a rewritten or forged manifest covers nothing. Reads manifests only.
    """
    files: dict[str, str] = {}
    for head in checkpoints.coverage().values():
        key, expected = head.manifest_key, head.manifest_sha256
        while key:
            try:
                data = store.get(key)
            except S3Unavailable:
                raise
            except Exception:  # noqa: BLE001 - gone (any store's "no such key"): the link does not hold
                break
            if sha256_hex(data) != expected:
                break
            try:
                manifest = Manifest.from_bytes(data)
            except (ValueError, KeyError, TypeError):
                break
            for f in manifest.files:
                files[f.key] = f.sha256
            key, expected = manifest.prev_manifest_key, manifest.prev_manifest_sha256
    return files


__all__ = [
    "CHECKPOINT_PREFIX",
    "AnchoredHead",
    "Checkpoint",
    "CheckpointInvalid",
    "CheckpointSet",
    "CheckpointSigner",
    "FoundCheckpoint",
    "KeyFileError",
    "collect_checkpoints",
    "covered_files",
    "generate_key_pair",
    "key_fingerprint",
    "load_private_key",
    "load_public_key",
    "open_checkpoint",
    "sign_checkpoint",
]
