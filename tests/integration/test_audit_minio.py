"""The audit log on real S3 semantics (MinIO with Object Lock): WORM refusals, verification, outages.

Every refusal here comes from the server, not from our code: the tests talk to S3 directly with
boto3 to try what an attacker or a careless operator would.
"""

from __future__ import annotations

import base64
import datetime as dt
import hashlib
import threading
import time

import pytest
from botocore.exceptions import ClientError
from entroloop.sinks.audit.parquet_writer import AuditParquetWriter
from entroloop.sinks.audit.verify import verify_store

from entroloop.contract.records import Audit
from entroloop.infra.worm.reader import find_records
from entroloop.infra.worm.s3_store import S3WormStore
from entroloop.infra.worm.worm_store import ObjectExists
from tests.integration.minio_fixtures import (  # noqa: F401  (fixtures)
    locked_bucket,
    minio_endpoint,
    own_minio,
    s3_client,
)
from tests.unit.sinks.sink_records import sample_records

pytestmark = pytest.mark.minio

TOPIC = Audit.topic


def _store(client, bucket: str, mode: str = "GOVERNANCE", days: float = 1, retry_seconds: float = 30) -> S3WormStore:
    return S3WormStore(client, bucket, lock_mode=mode, retention_days=days, retry_seconds=retry_seconds)


def _code(exc: ClientError) -> str:
    return exc.response["Error"]["Code"]


# AWS answers AccessDenied; MinIO answers InvalidRequest ("Object is WORM protected ...").
REFUSED = ("AccessDenied", "InvalidRequest")


def test_bucket_has_object_lock_and_versioning(locked_bucket):
    client, bucket = locked_bucket
    config = client.get_object_lock_configuration(Bucket=bucket)["ObjectLockConfiguration"]
    assert config["ObjectLockEnabled"] == "Enabled"
    assert client.get_bucket_versioning(Bucket=bucket)["Status"] == "Enabled"


def test_objects_are_locked_with_retention_and_a_sha256_checksum(locked_bucket):
    client, bucket = locked_bucket
    store = _store(client, bucket)
    assert store.put_once("a/b.bin", b"evidence") is True
    retention = client.get_object_retention(Bucket=bucket, Key="a/b.bin")["Retention"]
    assert retention["Mode"] == "GOVERNANCE"
    remaining = retention["RetainUntilDate"] - dt.datetime.now(dt.timezone.utc)
    assert dt.timedelta(hours=23) < remaining <= dt.timedelta(days=1)
    head = client.head_object(Bucket=bucket, Key="a/b.bin", ChecksumMode="ENABLED")
    assert base64.b64decode(head["ChecksumSHA256"]) == hashlib.sha256(b"evidence").digest()


def test_deleting_a_locked_version_is_refused_by_the_server(locked_bucket):
    client, bucket = locked_bucket
    _store(client, bucket).put_once("k", b"v1")
    version = client.head_object(Bucket=bucket, Key="k")["VersionId"]
    with pytest.raises(ClientError) as err:
        client.delete_object(Bucket=bucket, Key="k", VersionId=version)
    assert _code(err.value) in REFUSED
    assert client.get_object(Bucket=bucket, Key="k", VersionId=version)["Body"].read() == b"v1"


def test_overwriting_is_refused_and_a_forced_new_version_is_caught_by_verify(locked_bucket):
    client, bucket = locked_bucket
    store = _store(client, bucket)
    audits = sample_records(40, seed=31)[TOPIC]
    AuditParquetWriter(store).write(TOPIC, 0, 0, 39, audits)
    key = store.list("audit/")[0]
    original = store.get(key)
    # 1. our store never replaces bytes
    with pytest.raises(ObjectExists):
        store.put_once(key, b"forged")
    # 2. the server itself refuses a conditional create over an existing key
    with pytest.raises(ClientError) as err:
        client.put_object(Bucket=bucket, Key=key, Body=b"forged", IfNoneMatch="*")
    assert _code(err.value) in ("PreconditionFailed", "412")
    assert store.get(key) == original
    # 3. an unconditional put adds a new version (S3 semantics); the locked original stays,
    #    and the verifier reports the visible object as modified
    client.put_object(Bucket=bucket, Key=key, Body=b"forged")
    versions = client.list_object_versions(Bucket=bucket, Prefix=key)["Versions"]
    oldest = min(versions, key=lambda v: v["LastModified"])
    assert client.get_object(Bucket=bucket, Key=key, VersionId=oldest["VersionId"])["Body"].read() == original
    report = verify_store(store)
    assert [(p.kind, p.key) for p in report.problems] == [("modified", key)]


def test_shortening_retention_is_refused(locked_bucket):
    client, bucket = locked_bucket
    for mode in ("GOVERNANCE", "COMPLIANCE"):
        key = f"retained-{mode}"
        _store(client, bucket, mode=mode, days=1).put_once(key, b"x")
        sooner = dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=5)
        with pytest.raises(ClientError) as err:
            client.put_object_retention(Bucket=bucket, Key=key, Retention={"Mode": mode, "RetainUntilDate": sooner})
        assert _code(err.value) in REFUSED, mode
    # compliance mode can't be shortened even by a caller allowed to bypass governance
    with pytest.raises(ClientError):
        client.put_object_retention(
            Bucket=bucket, Key="retained-COMPLIANCE", BypassGovernanceRetention=True,
            Retention={"Mode": "COMPLIANCE", "RetainUntilDate": dt.datetime.now(dt.timezone.utc) + dt.timedelta(minutes=5)},
        )


def test_audit_log_on_s3_verifies_and_detects_a_missing_batch(locked_bucket):
    client, bucket = locked_bucket
    store = _store(client, bucket)
    writer = AuditParquetWriter(store)
    audits = sample_records(120, seed=32)[TOPIC]
    for first in range(0, 120, 30):
        writer.write(TOPIC, 1, first, first + 29, audits[first : first + 30])
    report = verify_store(store)
    assert report.ok and report.records == 120 and report.batches == 4
    # redelivery after a restart writes nothing
    again = AuditParquetWriter(_store(client, bucket))
    for first in range(0, 120, 30):
        again.write(TOPIC, 1, first, first + 29, audits[first : first + 30])
    assert again.files_written == 0 and again.batches_skipped == 4
    # a delete marker hides a file (allowed without a version id): verify names it missing
    key = store.list("audit/")[0]
    client.delete_object(Bucket=bucket, Key=key)
    assert ("missing", key) in {(p.kind, p.key) for p in verify_store(store).problems}


def test_a_restarted_writer_on_s3_stores_a_spool_replay_copy_once(locked_bucket):
    """A publisher's spool replay re-sends audits the broker already held, at new offsets, right
    after the audit sink restarted: the new writer reads back the chain's recent ids from S3."""
    client, bucket = locked_bucket
    audits = sample_records(50, seed=35)[TOPIC]
    first = AuditParquetWriter(_store(client, bucket))
    first.write(TOPIC, 2, 0, 19, audits[:20])
    first.write(TOPIC, 2, 20, 39, audits[20:40])
    restarted = AuditParquetWriter(_store(client, bucket))
    restarted.write(TOPIC, 2, 40, 52, [audits[3], *audits[40:50], audits[33], audits[39]])
    store = _store(client, bucket)
    report = verify_store(store)
    assert report.ok and report.records == 50  # each audit once, and the chain covers offsets 0..52
    assert restarted.recent.dropped == 3
    assert [r["audit_id"] for r in find_records(store, "audit_id", audits[33].audit_id)] == [audits[33].audit_id]


def test_writer_survives_minio_stopped_and_restarted_mid_run(own_minio):
    """Batches keep coming while the server is down for a few seconds: they wait, retry, land;
    nothing is lost and no object is written twice."""
    from entroloop.infra.worm.s3_store import ensure_bucket

    client = s3_client(own_minio.endpoint)
    bucket = "audit-restart"
    ensure_bucket(client, bucket)
    store = _store(client, bucket, retry_seconds=120)
    writer = AuditParquetWriter(store)
    audits = sample_records(400, seed=33)[TOPIC]
    batch = 20
    done = threading.Event()
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            for first in range(0, len(audits), batch):
                writer.write(TOPIC, 0, first, first + batch - 1, audits[first : first + batch])
                time.sleep(0.05)
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)
        finally:
            done.set()

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    while writer.batches_written < 3:
        time.sleep(0.02)
    own_minio.stop()
    outage_started = writer.batches_written
    time.sleep(3)
    assert writer.batches_written <= outage_started + 1  # nothing lands while the server is down
    own_minio.start()
    assert done.wait(180), "writer did not finish after MinIO came back"
    assert not errors, errors
    assert store.retries > 0, "the outage should have been retried"
    assert writer.batches_written == len(audits) // batch
    report = verify_store(store)
    assert report.ok, report.problems
    assert report.records == len(audits)
    versions = []
    paginator = client.get_paginator("list_object_versions")
    for page in paginator.paginate(Bucket=bucket):
        versions.extend(v["Key"] for v in page.get("Versions", []))
    assert len(versions) == len(set(versions)) == len(store.list()), "an object was written twice"


def test_cli_verifies_and_reads_the_s3_log(locked_bucket, minio_endpoint, monkeypatch):
    import json

    from typer.testing import CliRunner

    from entroloop.cli import app
    from tests.integration.minio_fixtures import ACCESS_KEY, SECRET_KEY

    client, bucket = locked_bucket
    audits = sample_records(30, seed=34)[TOPIC]
    AuditParquetWriter(_store(client, bucket)).write(TOPIC, 0, 0, 29, audits)
    for name, value in {
        "ENTROLOOP_AUDIT_STORE": "s3", "ENTROLOOP_S3_BUCKET": bucket, "ENTROLOOP_S3_ENDPOINT": minio_endpoint,
        "ENTROLOOP_S3_ACCESS_KEY": ACCESS_KEY, "ENTROLOOP_S3_SECRET_KEY": SECRET_KEY,
    }.items():
        monkeypatch.setenv(name, value)
    runner = CliRunner()
    result = runner.invoke(app, ["audit", "verify", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["records"] == 30
    result = runner.invoke(app, ["audit", "get", "--audit-id", audits[3].audit_id])
    assert result.exit_code == 0 and json.loads(result.stdout)["response"] == audits[3].response
    monkeypatch.setenv("ENTROLOOP_S3_BUCKET", "no-such-bucket")
    assert runner.invoke(app, ["audit", "verify"]).exit_code == 2
