"""Adapter registry: adapter files + manifest in a write-once object store, indexed in ClickHouse.

* Object keys: ``adapters/<adapter_id>/files/<relative path>`` and ``adapters/<adapter_id>/manifest.json``,
  written with ``put_once`` (local read-only files or S3 Object Lock): nothing is ever overwritten.
* ``adapter_id`` is derived from the content (every file's SHA-256, the base model digest, the data
  set digest and the parent), so a registration retried after a crash lands on the same keys: its
  files are already there byte for byte and its manifest is read back instead of written again.
* The manifest carries the SHA-256 of every file; ``fetch`` checks them all before handing a folder
  to vLLM, so a served adapter is provably the registered one.
* ClickHouse (migration 0003) indexes adapters and an append-only status history; every change is
  also an ``Action`` record through the ``ActionLog``.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from entroloop.training.actions import ActionLog

from entroloop.infra.adapter_routing import read_routings
from entroloop.infra.worm.worm_store import WormStore

MANIFEST_VERSION = 1
# "superseded": a promoted adapter replaced by a newer promoted one (so "promoted" means current).
STATUSES = ("candidate", "loaded", "canary", "promoted", "superseded", "rolled_back", "unloaded", "rejected")


class ManifestMismatch(RuntimeError):
    """A stored file does not match its manifest digest."""


@dataclass
class Manifest:
    adapter_id: str
    model: str
    base_model_digest: str
    dataset_digest: str
    parent_adapter: str
    trigger_key: str
    files: dict[str, dict[str, Any]]  # relative path -> {"sha256": ..., "bytes": ...}
    metrics: dict[str, Any] = field(default_factory=dict)
    created_at: float = 0.0
    manifest_version: int = MANIFEST_VERSION

    def to_bytes(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True, indent=1, default=str).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> Manifest:
        return cls(**json.loads(data))

    @property
    def total_bytes(self) -> int:
        return sum(int(f["bytes"]) for f in self.files.values())


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def adapter_files(adapter_dir: Path) -> dict[str, bytes]:
    """Every file of an adapter folder by relative posix path (dot-files excluded)."""
    adapter_dir = Path(adapter_dir)
    return {
        p.relative_to(adapter_dir).as_posix(): p.read_bytes()
        for p in sorted(adapter_dir.rglob("*"))
        if p.is_file() and not p.name.startswith(".")
    }


def content_adapter_id(model: str, files: dict[str, bytes], base_model_digest: str,
                       dataset_digest: str, parent: str) -> str:
    """A stable id from everything that makes the adapter what it is."""
    digest = hashlib.sha256()
    for path in sorted(files):
        digest.update(f"{path}\x00{_sha256(files[path])}\n".encode())
    digest.update(f"{base_model_digest}\x00{dataset_digest}\x00{parent}".encode())
    slug = re.sub(r"[^a-z0-9]+", "-", model.lower()).strip("-")[:40] or "model"
    return f"{slug}-lora-{digest.hexdigest()[:16]}"


class AdapterRegistry:
    def __init__(self, store: WormStore, client: Any, database: str, actions: ActionLog,
                 prefix: str = "adapters") -> None:
        self.store = store
        self.client = client
        self.database = database
        self.actions = actions
        self.prefix = prefix.strip("/")

    def ensure_schema(self) -> None:
        from entroloop.infra.clickhouse.schema import migrate

        migrate(self.client, self.database)

    def _key(self, adapter_id: str, *parts: str) -> str:
        return "/".join([self.prefix, adapter_id, *parts])

    def register(
        self, adapter_dir: Path, *, model: str, base_model_digest: str, dataset_digest: str,
        metrics: dict[str, Any], parent: str = "", trigger_key: str = "",
    ) -> Manifest:
        """Store the adapter's files and manifest once, index them, record the action."""
        files = adapter_files(adapter_dir)
        if not files:
            raise ValueError(f"{adapter_dir} holds no adapter files")
        adapter_id = content_adapter_id(model, files, base_model_digest, dataset_digest, parent)
        manifest_key = self._key(adapter_id, "manifest.json")
        for path, data in files.items():
            self.store.put_once(self._key(adapter_id, "files", path), data)
        if manifest_key in self.store.list(self._key(adapter_id) + "/"):
            manifest = Manifest.from_bytes(self.store.get(manifest_key))  # a retried registration
            written = False
        else:
            manifest = Manifest(
                adapter_id=adapter_id, model=model, base_model_digest=base_model_digest,
                dataset_digest=dataset_digest, parent_adapter=parent, trigger_key=trigger_key,
                files={p: {"sha256": _sha256(d), "bytes": len(d)} for p, d in files.items()},
                metrics=metrics, created_at=time.time(),
            )
            written = self.store.put_once(manifest_key, manifest.to_bytes())
        manifest_bytes = self.store.get(manifest_key)
        self.client.insert(
            f"{self.database}.adapters",
            [[adapter_id, _ts(manifest.created_at), model, trigger_key, parent, base_model_digest,
              dataset_digest, manifest_key, _sha256(manifest_bytes), len(files), manifest.total_bytes,
              json.dumps(metrics, sort_keys=True, default=str)]],
            column_names=["adapter_id", "registered_at", "model", "trigger_key", "parent_adapter",
                          "base_model_digest", "dataset_digest", "manifest_key", "manifest_sha256",
                          "files", "total_bytes", "metrics"],
        )
        self.actions.record(
            "adapter.registered", adapter_id, outcome="ok" if written else "already_registered",
            trigger_key=trigger_key, manifest_key=manifest_key, manifest_sha256=_sha256(manifest_bytes),
            store=self.store.describe(), files=len(files),
        )
        self.set_status(adapter_id, "candidate", detail="registered")
        return manifest

    def manifest(self, adapter_id: str) -> Manifest:
        return Manifest.from_bytes(self.store.get(self._key(adapter_id, "manifest.json")))

    def fetch(self, adapter_id: str, dest: Path) -> Path:
        """Write the adapter's files to ``dest`` after checking every SHA-256 against the manifest."""
        manifest = self.manifest(adapter_id)
        dest = Path(dest)
        for path, meta in manifest.files.items():
            data = self.store.get(self._key(adapter_id, "files", path))
            if _sha256(data) != meta["sha256"]:
                raise ManifestMismatch(f"{adapter_id}/{path}: SHA-256 differs from the manifest")
            target = dest / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        return dest

    def set_status(self, adapter_id: str, status: str, share: float = 0.0, detail: str = "",
                   action_id: str = "") -> None:
        if status not in STATUSES:
            raise ValueError(f"unknown adapter status {status!r}")
        self.client.insert(
            f"{self.database}.adapter_status",
            [[adapter_id, _ts(time.time()), status, float(share), action_id, detail]],
            column_names=["adapter_id", "at", "status", "share", "action_id", "detail"],
        )

    def status(self, adapter_id: str) -> str | None:
        rows = self.client.query(
            f"SELECT argMax(status, at) FROM {self.database}.adapter_status WHERE adapter_id = %(a)s "
            "GROUP BY adapter_id",
            parameters={"a": adapter_id},
        ).result_rows
        return rows[0][0] if rows else None

    def history(self, adapter_id: str) -> list[tuple[Any, str, float, str]]:
        return self.client.query(
            f"SELECT at, status, share, detail FROM {self.database}.adapter_status "
            "WHERE adapter_id = %(a)s ORDER BY at",
            parameters={"a": adapter_id},
        ).result_rows

    def list(self, model: str | None = None) -> list[dict[str, Any]]:
        where = "WHERE a.model = %(m)s" if model else ""
        rows = self.client.query(
            f"SELECT a.adapter_id, a.registered_at, a.model, a.parent_adapter, a.trigger_key, "
            f"a.dataset_digest, s.status FROM {self.database}.adapters AS a FINAL "
            f"LEFT JOIN (SELECT adapter_id, argMax(status, at) AS status FROM {self.database}.adapter_status "
            f"GROUP BY adapter_id) AS s ON s.adapter_id = a.adapter_id {where} ORDER BY a.registered_at",
            parameters={"m": model} if model else None,
        ).result_rows
        keys = ["adapter_id", "registered_at", "model", "parent_adapter", "trigger_key", "dataset_digest", "status"]
        return [dict(zip(keys, row)) for row in rows]

    def routing(self, model: str) -> dict[str, Any]:
        """Who serves ``model`` now, from the status history: the promoted adapter ("" = the base
        model) and the canary with its share. This is the durable routing state: a router in any
        process (``CanaryRouter.from_routing``, the gateway) and an operator read the same answer,
        through the one query in ``entroloop.infra.adapter_routing``."""
        return read_routings(self.client, self.database, model)[model].to_dict()

    def promoted(self, model: str) -> str:
        """The model's adapter currently promoted ("" for the base model)."""
        return str(self.routing(model)["stable"])


def _ts(at: float) -> Any:
    from datetime import datetime, timezone

    return datetime.fromtimestamp(at, tz=timezone.utc)


__all__ = ["AdapterRegistry", "Manifest", "ManifestMismatch", "STATUSES", "adapter_files", "content_adapter_id"]
