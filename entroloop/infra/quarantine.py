"""The dead-letter quarantine: raw bytes of records that could not be stored, readable by id only.

Why: a dead letter's payload is whatever arrived, often an audit with a prompt and an answer in
clear (an oversized audit, a record with one bad field). Kept in ``dead_letters.payload`` it was
searchable by anyone who can query ClickHouse; dropped, it would be lost. So the bytes go to a
write-once store keyed by the dead letter's ``event_id`` (a UUID, deterministic per source offset,
so a redelivery writes the same object again, which the store accepts as a no-op), and the table
keeps only the reason, the size and the SHA-256. Reading takes an id (``entroloop audit quarantine
ID``): there is no search and no listing command.

Embedded mode: ``DATA_DIR/quarantine`` (``LocalWormStore``: 0700 folders, 0400 files, never
overwritten). Distributed mode with the S3 audit store: objects under ``quarantine/`` in the audit
bucket, with the same Object Lock retention as the audit log.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass
from pathlib import Path

import msgspec

from entroloop.contract.records import DeadLetter
from entroloop.contract.settings import Settings
from entroloop.infra.worm.worm_store import LocalWormStore, ObjectExists, WormStore

PREFIX = "quarantine/"


class NotQuarantined(KeyError):
    """No quarantined payload under this id."""


@dataclass(frozen=True)
class QuarantinedPayload:
    """What ``Quarantine.get`` returns: the bytes and where they came from."""

    dead_letter_id: str
    data: bytes
    location: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()


def _canonical_id(dead_letter_id: str) -> str:
    """The id as a canonical UUID string; anything else (paths, patterns) is refused."""
    try:
        return str(uuid.UUID(str(dead_letter_id).strip()))
    except ValueError:
        raise ValueError(
            f"{dead_letter_id!r} is not a dead-letter id: give the event_id (a UUID) of a row of dead_letters"
        ) from None


class Quarantine:
    """Write-once payloads of dead letters in a ``WormStore``, under ``prefix``, keyed by id."""

    def __init__(self, store: WormStore, prefix: str = PREFIX) -> None:
        self.store = store
        self.prefix = prefix

    def key(self, dead_letter_id: str) -> str:
        return f"{self.prefix}{_canonical_id(dead_letter_id)}.bin"

    def put(self, dead_letter_id: str, payload: bytes) -> bool:
        """Keep ``payload`` under ``dead_letter_id``. True if stored now; False if this id already
        holds bytes (a redelivery, or the whole payload kept earlier where only its start arrives
        now): the first copy is never replaced."""
        try:
            return self.store.put_once(self.key(dead_letter_id), payload)
        except ObjectExists:
            return False

    def keep(self, letter: DeadLetter, payload: bytes | None = None) -> DeadLetter:
        """Quarantine ``payload`` (default: the letter's own) and return the letter without it.

        The returned letter still names the payload by ``payload_sha256`` and ``payload_size``.
        """
        data = letter.payload if payload is None else payload
        if data:
            self.put(letter.event_id, data)
        sha = letter.payload_sha256 or hashlib.sha256(data).hexdigest()
        size = letter.payload_size or len(data)
        return msgspec.structs.replace(letter, payload=b"", payload_sha256=sha, payload_size=size)

    def get(self, dead_letter_id: str) -> QuarantinedPayload:
        """The quarantined bytes of one dead letter; ``NotQuarantined`` if there are none."""
        key = self.key(dead_letter_id)
        try:
            data = self.store.get(key)
        except (FileNotFoundError, KeyError) as exc:
            raise NotQuarantined(f"no quarantined payload for dead letter {dead_letter_id}") from exc
        except Exception as exc:  # S3 clients raise their own NoSuchKey types
            if "NoSuchKey" in type(exc).__name__ or "NoSuchKey" in str(exc) or "404" in str(exc):
                raise NotQuarantined(f"no quarantined payload for dead letter {dead_letter_id}") from exc
            raise
        return QuarantinedPayload(_canonical_id(dead_letter_id), data, f"{self.store.describe()}/{key}")


def strip_payloads(letters: list[DeadLetter], quarantine: Quarantine | None) -> list[DeadLetter]:
    """The letters as they may be stored: payloads moved to ``quarantine`` (or, without one, dropped
    from storage; the dead-letter topic still holds them for its retention)."""
    out = []
    for letter in letters:
        if quarantine is not None:
            out.append(quarantine.keep(letter))
        elif letter.payload:
            sha = letter.payload_sha256 or hashlib.sha256(letter.payload).hexdigest()
            out.append(msgspec.structs.replace(letter, payload=b"", payload_sha256=sha,
                                               payload_size=letter.payload_size or len(letter.payload)))
        else:
            out.append(letter)
    return out


def local_quarantine(data_dir: Path) -> Quarantine:
    """The embedded mode's quarantine: ``DATA_DIR/quarantine``, its own write-once folder."""
    return Quarantine(LocalWormStore(Path(data_dir) / "quarantine"), prefix="")


def quarantine_from_settings(settings: Settings) -> Quarantine:
    """The quarantine beside the audit log: a local folder, or ``quarantine/`` in the S3 bucket."""
    if settings.audit_store == "local":
        return local_quarantine(Path(settings.data_dir))
    from entroloop.infra.worm.stores import open_worm_store

    return Quarantine(open_worm_store(settings), prefix=PREFIX)


__all__ = [
    "PREFIX",
    "NotQuarantined",
    "Quarantine",
    "QuarantinedPayload",
    "local_quarantine",
    "quarantine_from_settings",
    "strip_payloads",
]
