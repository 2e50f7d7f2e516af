"""Opening the audit log's write-once store from settings: local folder or S3 with Object Lock."""

from __future__ import annotations

from pathlib import Path

from entroloop.contract.settings import Settings
from entroloop.infra.worm.worm_store import LocalWormStore, WormStore


def local_store_path(settings: Settings) -> Path:
    """The embedded mode's audit folder (the embedded runner writes there too)."""
    return Path(settings.data_dir) / "worm"


def open_worm_store(settings: Settings, create_bucket: bool = False) -> WormStore:
    """The store named by ``ENTROLOOP_AUDIT_STORE``; ``create_bucket`` makes an S3 bucket with Object Lock."""
    if settings.audit_store == "local":
        return LocalWormStore(local_store_path(settings))
    if settings.audit_store != "s3":
        raise ValueError(f"ENTROLOOP_AUDIT_STORE must be `local` or `s3`, not {settings.audit_store!r}")
    from entroloop.infra.worm.s3_store import S3WormStore, ensure_bucket, make_s3_client

    client = make_s3_client(
        settings.s3_endpoint, settings.s3_region, settings.s3_access_key, settings.s3_secret_key.get_secret_value()
    )
    if create_bucket:
        ensure_bucket(client, settings.s3_bucket)
    return S3WormStore(
        client,
        settings.s3_bucket,
        prefix=settings.s3_prefix,
        lock_mode=settings.audit_lock_mode,
        retention_days=settings.audit_retention_days,
        retry_seconds=settings.s3_retry_seconds,
        anchor_lock_mode=settings.audit_checkpoint_lock_mode,
    )
