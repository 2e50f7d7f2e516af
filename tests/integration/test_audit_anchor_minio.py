"""Signed checkpoints in the S3 store (MinIO with Object Lock): objects under ``checkpoints/`` locked
in COMPLIANCE mode, which even a user allowed to bypass governance retention cannot delete; a
truncation done with that privilege, and a forged append, are caught against them.

The audit objects themselves are GOVERNANCE-locked here (the test mode of ENTROLOOP_AUDIT_LOCK_MODE),
so a privileged attacker can delete object versions: exactly the case checkpoints must survive.
"""

from __future__ import annotations

import pytest
from botocore.exceptions import ClientError
from entroloop.sinks.audit.checkpointer import checkpointer_from_settings
from entroloop.sinks.audit.parquet_writer import AuditParquetWriter
from entroloop.sinks.audit.verify import verify_store

from entroloop.contract.records import Audit
from entroloop.contract.settings import load_settings
from entroloop.infra.worm.anchors import S3Anchor, log_name, read_checkpoints
from entroloop.infra.worm.checkpoints import (
    CHECKPOINT_PREFIX,
    generate_key_pair,
    load_public_key,
)
from entroloop.infra.worm.manifest import Head, Manifest
from entroloop.infra.worm.s3_store import S3WormStore
from tests.integration.minio_fixtures import (  # noqa: F401  (fixtures)
    locked_bucket,
    minio_endpoint,
)
from tests.unit.sinks.sink_records import sample_records

pytestmark = pytest.mark.minio

TOPIC = Audit.topic
REFUSED = ("AccessDenied", "InvalidRequest")  # AWS / MinIO ("Object is WORM protected")
RETENTION_DAYS = 120 / 86_400  # two minutes: long enough for the test, short enough to expire on a shared MinIO


def _delete_all_versions(client, bucket: str, key: str) -> None:
    """What an attacker allowed to bypass governance retention can do to a GOVERNANCE object."""
    for version in client.list_object_versions(Bucket=bucket, Prefix=key).get("Versions", []):
        if version["Key"] == key:
            client.delete_object(Bucket=bucket, Key=key, VersionId=version["VersionId"], BypassGovernanceRetention=True)


def _write_log(store: S3WormStore, settings) -> AuditParquetWriter:
    writer = AuditParquetWriter(store, checkpointer=checkpointer_from_settings(settings, store))
    audits = sample_records(60, seed=5)[TOPIC]
    for first in range(0, 60, 20):
        writer.write(TOPIC, 0, first, first + 19, audits[first : first + 20])
    return writer


@pytest.fixture
def anchored_s3(locked_bucket, tmp_path):  # noqa: F811 - the imported fixture
    client, bucket = locked_bucket
    private, public = generate_key_pair(tmp_path / "keys")
    settings = load_settings(data_dir=tmp_path / "data", audit_store="s3", s3_bucket=bucket,
                             audit_signing_key_file=private)
    store = S3WormStore(client, bucket, lock_mode="GOVERNANCE", retention_days=RETENTION_DAYS, retry_seconds=30,
                        anchor_lock_mode="COMPLIANCE")
    writer = _write_log(store, settings)
    assert writer.checkpointer is not None and writer.checkpointer.written == 3
    return client, bucket, store, load_public_key(public), log_name(settings)


def test_checkpoints_are_compliance_locked_and_cannot_be_deleted(anchored_s3):
    client, bucket, store, _, _ = anchored_s3
    keys = store.list(CHECKPOINT_PREFIX)
    assert len(keys) == 3
    retention = client.get_object_retention(Bucket=bucket, Key=keys[-1])["Retention"]
    assert retention["Mode"] == "COMPLIANCE"
    with pytest.raises(ClientError) as refused:
        _delete_all_versions(client, bucket, keys[-1])
    assert refused.value.response["Error"]["Code"] in REFUSED
    assert store.list(CHECKPOINT_PREFIX) == keys


def test_intact_s3_log_verifies_against_its_checkpoints(anchored_s3):
    _, _, store, public, log = anchored_s3
    checkpoints = read_checkpoints([S3Anchor(store)], log, public)
    report = verify_store(store, checkpoints)
    assert report.ok, report.problems
    assert report.anchor["checkpoints_valid"] == 3 and report.anchor["newest"]["source"].startswith("s3:checkpoints/")


def test_privileged_truncation_is_caught_by_the_compliance_checkpoints(anchored_s3):
    client, bucket, store, public, log = anchored_s3
    newest = store.list(f"manifests/{TOPIC}-p000-")[-1]
    manifest = Manifest.from_bytes(store.get(newest))
    for key in [f.key for f in manifest.files] + [newest, Head(manifest.chain, manifest.seq, "", "", 0).key]:
        _delete_all_versions(client, bucket, key)  # GOVERNANCE: the bypass lets it through
    assert verify_store(store).ok  # consistent: the bucket alone cannot tell
    report = verify_store(store, read_checkpoints([S3Anchor(store)], log, public))
    assert "truncated" in report.kinds(), report.problems


def test_forged_append_in_the_bucket_is_unanchored(anchored_s3):
    _, _, store, public, log = anchored_s3
    forged = sample_records(5, seed=66)[TOPIC]
    AuditParquetWriter(store).write(TOPIC, 0, 60, 60 + len(forged) - 1, forged)  # no signing key
    assert verify_store(store).ok
    report = verify_store(store, read_checkpoints([S3Anchor(store)], log, public))
    assert "unanchored" in report.kinds(), report.problems
