"""Write-once audit objects on S3 (or MinIO) with Object Lock.

Each object is uploaded with

* ``IfNoneMatch="*"``: the server refuses to create a second version of an existing key, so a
  retried upload (its first answer lost on the network) or a redelivered batch never becomes a
  second object. The refusal (412) is then resolved by comparing content: identical bytes are a
  redelivery, different bytes raise ``ObjectExists``;
* ``ObjectLockMode`` + ``ObjectLockRetainUntilDate``: COMPLIANCE for ``retention_days`` in
  production (nobody can delete or overwrite the version, or shorten its retention, until then),
  GOVERNANCE with a short retention in tests;
* checkpoints (``put_anchor``, objects under ``checkpoints/``) get their own lock mode,
  COMPLIANCE unless a test asks for GOVERNANCE: a signed checkpoint is the log's anchor, so not
  even the bucket's root user may delete it or shorten its retention (``checkpoints``);
* ``ChecksumSHA256``: the server recomputes SHA-256 of what it received and rejects a corrupted
  upload; the same digest is the one the manifests record.

An unreachable endpoint is retried with capped exponential backoff for ``retry_seconds`` before
``S3Unavailable`` is raised, so a short S3 outage makes the writer wait (and, upstream, the sink
batcher apply backpressure) instead of losing or duplicating records.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import time
from collections.abc import Callable
from typing import Any, TypeVar

from entroloop.infra.worm.worm_store import ObjectExists

T = TypeVar("T")


class S3Unavailable(RuntimeError):
    """S3 stayed unreachable for longer than the store's retry budget."""


def _is_transient(exc: Exception) -> bool:
    from botocore.exceptions import (
        ClientError,
        ConnectionClosedError,
        EndpointConnectionError,
        ReadTimeoutError,
    )

    if isinstance(exc, (EndpointConnectionError, ConnectionClosedError, ReadTimeoutError, ConnectionError)):
        return True
    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        code = exc.response.get("Error", {}).get("Code", "")
        return status >= 500 or code in ("SlowDown", "ServiceUnavailable", "RequestTimeout", "XMinioServerNotInitialized")
    return type(exc).__name__ in ("ProtocolError", "NewConnectionError", "MaxRetryError")


def _error_code(exc: Exception) -> str:
    response = getattr(exc, "response", None) or {}
    return str(response.get("Error", {}).get("Code", ""))


def make_s3_client(endpoint: str = "", region: str = "us-east-1", access_key: str = "", secret_key: str = "") -> Any:
    """A boto3 S3 client with short timeouts (retries are this module's job, with a deadline)."""
    import boto3
    from botocore.config import Config

    config = Config(
        connect_timeout=3,
        read_timeout=30,
        retries={"max_attempts": 1, "mode": "standard"},
        s3={"addressing_style": "path"},
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    kwargs: dict[str, Any] = {"region_name": region, "config": config}
    if endpoint:
        kwargs["endpoint_url"] = endpoint
    if access_key:
        kwargs["aws_access_key_id"] = access_key
        kwargs["aws_secret_access_key"] = secret_key
    return boto3.client("s3", **kwargs)


_STARTING = ("503", "ServiceUnavailable", "SlowDown", "XMinioServerNotInitialized")


def ensure_bucket(client: Any, bucket: str, wait_s: float = 60.0) -> bool:
    """Create ``bucket`` with Object Lock enabled unless it exists; True if created now.

    Object Lock can only be chosen when a bucket is created (it also turns on versioning), so an
    existing bucket without it is an error, not something to fix silently. A server still starting
    up is waited for up to ``wait_s``.
    """
    deadline = time.monotonic() + wait_s
    while True:
        try:
            client.head_bucket(Bucket=bucket)
            break
        except Exception as exc:
            code = _error_code(exc)
            if code in ("404", "NoSuchBucket", "NotFound"):
                client.create_bucket(Bucket=bucket, ObjectLockEnabledForBucket=True)
                return True
            # a server that is still starting answers 503 (MinIO: "server not initialized")
            if code not in _STARTING or time.monotonic() > deadline:
                raise
            time.sleep(0.5)
    config = client.get_object_lock_configuration(Bucket=bucket).get("ObjectLockConfiguration", {})
    if config.get("ObjectLockEnabled") != "Enabled":
        raise RuntimeError(f"bucket {bucket} exists without Object Lock; audit objects need a bucket created with it")
    return False


class S3WormStore:
    """``WormStore`` on an S3 bucket created with Object Lock."""

    def __init__(
        self,
        client: Any,
        bucket: str,
        prefix: str = "",
        lock_mode: str = "COMPLIANCE",
        retention_days: float = 2557,
        retry_seconds: float = 300.0,
        sleep: Callable[[float], None] = time.sleep,
        anchor_lock_mode: str = "COMPLIANCE",
    ) -> None:
        if lock_mode not in ("COMPLIANCE", "GOVERNANCE"):
            raise ValueError("lock_mode must be COMPLIANCE or GOVERNANCE")
        if anchor_lock_mode not in ("COMPLIANCE", "GOVERNANCE"):
            raise ValueError("anchor_lock_mode must be COMPLIANCE or GOVERNANCE")
        self.anchor_lock_mode = anchor_lock_mode
        self.client = client
        self.bucket = bucket
        self.prefix = prefix.strip("/") + "/" if prefix.strip("/") else ""
        self.lock_mode = lock_mode
        self.retention_days = retention_days
        self.retry_seconds = retry_seconds
        self.sleep = sleep
        self.retries = 0  # transient failures retried (visible in benchmarks and tests)

    # --- retry -----------------------------------------------------------------------------------
    def _call(self, what: str, fn: Callable[[], T]) -> T:
        deadline = time.monotonic() + self.retry_seconds
        delay = 0.2
        while True:
            try:
                return fn()
            except Exception as exc:
                if not _is_transient(exc):
                    raise
                if time.monotonic() + delay > deadline:
                    raise S3Unavailable(f"{what}: S3 at {self.describe()} unreachable for {self.retry_seconds:.0f}s: {exc}") from exc
                self.retries += 1
                self.sleep(delay)
                delay = min(delay * 2, 5.0)

    # --- WormStore -------------------------------------------------------------------------------
    def retain_until(self) -> dt.datetime:
        return dt.datetime.now(dt.UTC) + dt.timedelta(days=self.retention_days)

    def put_once(self, key: str, data: bytes) -> bool:
        return self._put_once(key, data, self.lock_mode)

    def put_anchor(self, key: str, data: bytes) -> bool:
        """``put_once`` with the anchors' lock mode (COMPLIANCE in production): for signed
        checkpoints, which must outlive anyone who can write the bucket."""
        return self._put_once(key, data, self.anchor_lock_mode)

    def _put_once(self, key: str, data: bytes, lock_mode: str) -> bool:
        digest = hashlib.sha256(data).digest()

        def put() -> bool:
            try:
                self.client.put_object(
                    Bucket=self.bucket,
                    Key=self.prefix + key,
                    Body=data,
                    IfNoneMatch="*",
                    ChecksumSHA256=base64.b64encode(digest).decode(),
                    ObjectLockMode=lock_mode,
                    ObjectLockRetainUntilDate=self.retain_until(),
                )
                return True
            except Exception as exc:
                if _error_code(exc) in ("PreconditionFailed", "412"):
                    return False
                if _error_code(exc) == "ConditionalRequestConflict":  # a concurrent put of this key
                    raise ConnectionError("conditional put conflict, retrying") from exc
                raise

        if self._call(f"put {key}", put):
            return True
        existing = self.get(key)
        if hashlib.sha256(existing).digest() != digest:
            raise ObjectExists(f"{key} already exists with different content; it is never overwritten")
        return False

    def get(self, key: str) -> bytes:
        return self._call(
            f"get {key}", lambda: self.client.get_object(Bucket=self.bucket, Key=self.prefix + key)["Body"].read()
        )

    def list(self, prefix: str = "") -> list[str]:
        def listing() -> list[str]:
            keys = []
            paginator = self.client.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=self.prefix + prefix):
                keys.extend(obj["Key"][len(self.prefix) :] for obj in page.get("Contents", []))
            return sorted(keys)

        return self._call(f"list {prefix}", listing)

    def describe(self) -> str:
        endpoint = getattr(getattr(self.client, "meta", None), "endpoint_url", "")
        return f"s3:{endpoint}/{self.bucket}/{self.prefix}"
