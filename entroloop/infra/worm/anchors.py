"""Where signed checkpoints of the audit log are kept: places the log's own folder does not reach.

* ClickHouse table ``audit_checkpoints`` (migration 0005): one row per checkpoint; a second system
  with its own access control, and one query reads every checkpoint back.
* S3 objects under ``checkpoints/`` in the S3 audit store, locked in COMPLIANCE mode
  (``S3WormStore.put_anchor``): nobody, the bucket's root user included, can delete them before
  their retention ends, so the newest checkpoint cannot be taken away to hide a truncation.
* A folder (``ENTROLOOP_AUDIT_CHECKPOINT_DIR``) on another mount, and any checkpoint file or folder
  an auditor passes to ``entroloop audit verify --checkpoint``.

The checkpoints themselves (format, signing, checking) are ``checkpoints``. Nothing here trusts a
document: every one goes through ``collect_checkpoints`` with the public key before it counts.
"""

from __future__ import annotations

import datetime as dt
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol

from entroloop.contract.settings import Settings
from entroloop.infra.worm.checkpoints import (
    CHECKPOINT_PREFIX,
    Checkpoint,
    CheckpointSet,
    collect_checkpoints,
)
from entroloop.infra.worm.worm_store import LocalWormStore, WormStore

CHECKPOINT_TABLE = "audit_checkpoints"


class AnchorConfigError(ValueError):
    """An anchor setting that would defeat its purpose (a key or folder inside the data folder)."""


class CheckpointAnchor(Protocol):
    def describe(self) -> str: ...

    def put(self, checkpoint: Checkpoint, document: bytes) -> None:
        """Keep one signed checkpoint (idempotent: the same document again is no second copy)."""

    def documents(self, log: str) -> list[tuple[str, bytes]]:
        """Every stored checkpoint document of ``log`` as (where, bytes); unverified."""


class ClickHouseAnchor:
    """Checkpoints as rows of ``DB.audit_checkpoints`` (the table migration 0005 creates)."""

    def __init__(self, client: Any, database: str) -> None:
        self.client = client
        self.database = database

    def describe(self) -> str:
        return f"clickhouse:{self.database}.{CHECKPOINT_TABLE}"

    def put(self, checkpoint: Checkpoint, document: bytes) -> None:
        created = dt.datetime.fromtimestamp(checkpoint.created_at, dt.UTC)
        self.client.insert(
            f"{self.database}.{CHECKPOINT_TABLE}",
            [[checkpoint.log, created, checkpoint.writer, checkpoint.number, checkpoint.batches,
              checkpoint.key_fingerprint, document.decode()]],
            column_names=["log", "created_at", "writer", "number", "batches", "key_fingerprint", "document"],
        )

    def documents(self, log: str) -> list[tuple[str, bytes]]:
        rows = self.client.query(
            f"SELECT writer, number, document FROM {self.database}.{CHECKPOINT_TABLE} "
            "WHERE log = %(log)s ORDER BY created_at, writer, number",
            parameters={"log": log},
        ).result_rows
        return [(f"{self.describe()}[{writer}#{number}]", doc.encode()) for writer, number, doc in rows]


class S3Anchor:
    """Checkpoints as COMPLIANCE-locked objects under ``checkpoints/`` of the S3 audit store."""

    def __init__(self, store: Any) -> None:
        self.store = store  # an S3WormStore (has put_anchor)

    def describe(self) -> str:
        return f"{self.store.describe()}{CHECKPOINT_PREFIX} ({self.store.anchor_lock_mode})"

    def put(self, checkpoint: Checkpoint, document: bytes) -> None:
        self.store.put_anchor(CHECKPOINT_PREFIX + checkpoint.name, document)

    def documents(self, log: str) -> list[tuple[str, bytes]]:
        keys = self.store.list(CHECKPOINT_PREFIX)
        with ThreadPoolExecutor(8) as pool:  # many small objects: latency, not bandwidth, bounds this
            bodies = list(pool.map(self.store.get, keys))
        return [(f"s3:{key}", body) for key, body in zip(keys, bodies, strict=True)]


class FolderAnchor:
    """Checkpoints as read-only files in a folder outside the data folder (or one checkpoint file,
    read only, as given on the command line)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)

    def describe(self) -> str:
        return f"file:{self.path}"

    def put(self, checkpoint: Checkpoint, document: bytes) -> None:
        LocalWormStore(self.path).put_once(checkpoint.name, document)

    def documents(self, log: str) -> list[tuple[str, bytes]]:
        if self.path.is_file():
            return [(f"file:{self.path}", self.path.read_bytes())]
        if not self.path.is_dir():
            raise FileNotFoundError(f"no checkpoint file or folder at {self.path}")
        return [(f"file:{p}", p.read_bytes()) for p in sorted(self.path.glob("*.json"))]


def log_name(settings: Settings) -> str:
    """The name checkpoints give the log, so one of another log is never taken for this one's."""
    if settings.audit_store == "s3":
        return f"s3://{settings.s3_bucket}/{settings.s3_prefix.strip('/')}"
    return "local"


def require_outside_data_dir(path: Path, setting: str, settings: Settings) -> None:
    """Refuse an anchor or key inside the data folder: whoever can rewrite the log could rewrite it."""
    inside = Path(path).expanduser().resolve()
    data = Path(settings.data_dir).expanduser().resolve()
    if inside == data or data in inside.parents:
        raise AnchorConfigError(
            f"{setting}={path} lies inside ENTROLOOP_DATA_DIR ({data}); anyone who can rewrite the audit "
            f"log could then rewrite its anchor too. Move it outside the data folder and set {setting} again."
        )


def _clickhouse_for_reader(settings: Settings) -> Any | None:
    """A ClickHouse client to read checkpoints from; None if the embedded folder was never created."""
    from entroloop.infra.clickhouse.client import connect

    dsn = settings.resolved_clickhouse_dsn()
    if dsn.startswith("chdb://") and not Path(dsn.removeprefix("chdb://")).exists():
        return None
    return connect(dsn, settings.clickhouse_password.get_secret_value())


def writer_anchors(settings: Settings, store: WormStore, clickhouse_client: Any | None = None) -> list[CheckpointAnchor]:
    """Where a writer keeps its checkpoints: ClickHouse (the caller's client, or a server named by
    the DSN: an embedded chDB folder belongs to the process that opened it), the S3 store, a folder."""
    anchors: list[CheckpointAnchor] = []
    if clickhouse_client is None and settings.resolved_clickhouse_dsn().startswith(("http://", "https://")):
        from entroloop.infra.clickhouse.client import connect

        clickhouse_client = connect(settings.resolved_clickhouse_dsn(), settings.clickhouse_password.get_secret_value())
    if clickhouse_client is not None:
        from entroloop.infra.clickhouse.schema import migrate

        migrate(clickhouse_client, settings.clickhouse_database)  # 0005 creates audit_checkpoints
        anchors.append(ClickHouseAnchor(clickhouse_client, settings.clickhouse_database))
    if hasattr(store, "put_anchor"):
        anchors.append(S3Anchor(store))
    if settings.audit_checkpoint_dir is not None:
        require_outside_data_dir(settings.audit_checkpoint_dir, "ENTROLOOP_AUDIT_CHECKPOINT_DIR", settings)
        anchors.append(FolderAnchor(settings.audit_checkpoint_dir))
    return anchors


def reader_anchors(settings: Settings, store: WormStore, files: list[Path] | None = None) -> tuple[list[CheckpointAnchor], list[str]]:
    """Every place ``verify`` and ``get`` read checkpoints from, and the ones that could not be
    opened (with why): checkpoint files given, the checkpoint folder, the S3 store, ClickHouse."""
    anchors: list[CheckpointAnchor] = [FolderAnchor(f) for f in files or []]
    errors: list[str] = []
    if settings.audit_checkpoint_dir is not None:
        anchors.append(FolderAnchor(settings.audit_checkpoint_dir))
    if hasattr(store, "put_anchor"):
        anchors.append(S3Anchor(store))
    try:
        client = _clickhouse_for_reader(settings)
    except Exception as exc:  # noqa: BLE001 - a locked or unreachable ClickHouse is reported, not fatal
        errors.append(f"clickhouse: {type(exc).__name__}: {exc}")
    else:
        if client is not None:
            anchors.append(ClickHouseAnchor(client, settings.clickhouse_database))
    return anchors, errors


def read_checkpoints(anchors: list[CheckpointAnchor], log: str, public_key: Any, errors: list[str] | None = None) -> CheckpointSet:
    """Read every anchor and keep the checkpoints whose signature verifies under ``public_key``."""
    documents: list[tuple[str, bytes]] = []
    sources: list[str] = []
    source_errors = list(errors or [])
    for anchor in anchors:
        try:
            documents.extend(anchor.documents(log))
            sources.append(anchor.describe())
        except Exception as exc:  # noqa: BLE001 - one unreadable anchor must not hide the others
            message = str(exc).splitlines()[0] if str(exc) else ""
            if "UNKNOWN_TABLE" in message or "Unknown table" in message or "doesn't exist" in message:
                message = "no audit_checkpoints table (nothing was ever checkpointed there)"
            source_errors.append(f"{anchor.describe()}: {type(exc).__name__}: {message}")
    found = collect_checkpoints(log, public_key, documents, sources)
    found.source_errors = source_errors
    return found


__all__ = [
    "CHECKPOINT_TABLE",
    "AnchorConfigError",
    "CheckpointAnchor",
    "ClickHouseAnchor",
    "FolderAnchor",
    "S3Anchor",
    "log_name",
    "read_checkpoints",
    "reader_anchors",
    "require_outside_data_dir",
    "writer_anchors",
]
