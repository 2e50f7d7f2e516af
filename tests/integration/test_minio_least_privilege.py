"""The audit sink's MinIO policy, judged by a real MinIO server (issue 12, finding 8).

docker-compose's minio-init (scripts/compose/minio-init.sh) gives sink-audit a user that may put
COMPLIANCE-locked objects, read and list them, and nothing else; the trainer gets a read-only user.
Objects written here are COMPLIANCE-locked for one day in a test bucket (nobody can remove them
before; the test server's data is a temporary folder or the shared test MinIO). Here the
policy documents that script writes are handed to MinIO itself, as the inline session policy of
STS AssumeRole credentials (MinIO then allows exactly what the session policy allows, the same
evaluation as for a user with that policy attached), and the real audit store writes with them.
No ``mc`` client is needed on the test machine.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import uuid
from pathlib import Path
from typing import Any

import pytest
from botocore.exceptions import ClientError

from entroloop.infra.worm.s3_store import S3WormStore, ensure_bucket, make_s3_client
from tests.integration.minio_fixtures import (  # noqa: F401
    ACCESS_KEY,
    SECRET_KEY,
    minio_endpoint,
    s3_client,
)
from tests.unit.test_docker_compose import env_example, random_passwords, run_minio_init

pytestmark = pytest.mark.minio

DENIED = ("AccessDenied",)


def root_credentials(endpoint: str) -> tuple[str, str]:
    if endpoint == os.environ.get("ENTROLOOP_S3_ENDPOINT"):
        return os.environ.get("ENTROLOOP_S3_ACCESS_KEY", ACCESS_KEY), os.environ.get("ENTROLOOP_S3_SECRET_KEY", SECRET_KEY)
    return ACCESS_KEY, SECRET_KEY


def client_with_policy(endpoint: str, policy: dict[str, Any]) -> Any:
    """An S3 client whose credentials may do what ``policy`` allows and nothing more."""
    import boto3

    access, secret = root_credentials(endpoint)
    sts = boto3.client("sts", endpoint_url=endpoint, region_name="us-east-1",
                       aws_access_key_id=access, aws_secret_access_key=secret)
    creds = sts.assume_role(RoleArn="arn:minio:iam:::role/entroloop-test", RoleSessionName="audit-policy",
                            Policy=json.dumps(policy), DurationSeconds=900)["Credentials"]
    template = make_s3_client(endpoint, "us-east-1", access, secret)  # the store's client settings
    return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", config=template.meta.config,
                        aws_access_key_id=creds["AccessKeyId"], aws_secret_access_key=creds["SecretAccessKey"],
                        aws_session_token=creds["SessionToken"])


@pytest.fixture
def policies(minio_endpoint: str, tmp_path: Path) -> tuple[str, dict[str, dict[str, Any]]]:  # noqa: F811
    """A fresh locked bucket and the policies minio-init.sh writes for it."""
    bucket = f"audit-{uuid.uuid4().hex[:16]}"
    assert ensure_bucket(s3_client(minio_endpoint), bucket) is True
    env = {**env_example(), **random_passwords(), "ENTROLOOP_S3_BUCKET": bucket}
    _, _, documents, _ = run_minio_init(env, tmp_path)
    return bucket, documents


def code(exc: ClientError) -> str:
    return exc.response["Error"]["Code"]


def test_the_writer_policy_is_enough_for_the_audit_store(minio_endpoint: str, policies) -> None:  # noqa: F811
    bucket, documents = policies
    client = client_with_policy(minio_endpoint, documents["entroloop-audit-writer"])
    assert ensure_bucket(client, bucket) is False  # head + Object Lock check, as `sink audit --create-bucket`
    store = S3WormStore(client, bucket, lock_mode="COMPLIANCE", retention_days=1, retry_seconds=5)
    assert store.put_once("audit/0/000001.parquet", b"evidence") is True
    assert store.put_once("audit/0/000001.parquet", b"evidence") is False  # a redelivery re-reads, stores nothing
    assert store.get("audit/0/000001.parquet") == b"evidence"
    assert store.list("audit/") == ["audit/0/000001.parquet"]
    retention = s3_client(minio_endpoint).get_object_retention(Bucket=bucket, Key="audit/0/000001.parquet")
    assert retention["Retention"]["Mode"] == "COMPLIANCE"


def test_the_writer_cannot_delete_unlock_or_administer(minio_endpoint: str, policies) -> None:  # noqa: F811
    bucket, documents = policies
    client = client_with_policy(minio_endpoint, documents["entroloop-audit-writer"])
    S3WormStore(client, bucket, lock_mode="COMPLIANCE", retention_days=1, retry_seconds=5).put_once("k", b"x")
    version = s3_client(minio_endpoint).head_object(Bucket=bucket, Key="k")["VersionId"]
    # a GOVERNANCE object (as the tests write): MinIO lets s3:PutObjectRetention alone shorten one
    S3WormStore(s3_client(minio_endpoint), bucket, lock_mode="GOVERNANCE", retention_days=1).put_once("g", b"y")
    governed = s3_client(minio_endpoint).head_object(Bucket=bucket, Key="g")["VersionId"]
    soon = dt.datetime.now(dt.UTC) + dt.timedelta(hours=1)  # before the object's 1-day retention ends
    attempts = {
        "delete marker": lambda: client.delete_object(Bucket=bucket, Key="k"),
        "delete version": lambda: client.delete_object(Bucket=bucket, Key="k", VersionId=version,
                                                       BypassGovernanceRetention=True),
        "shorten a governance retention": lambda: client.put_object_retention(
            Bucket=bucket, Key="g", VersionId=governed, BypassGovernanceRetention=True,
            Retention={"Mode": "GOVERNANCE", "RetainUntilDate": soon}),
        "write a governance object": lambda: S3WormStore(
            client, bucket, lock_mode="GOVERNANCE", retention_days=1, retry_seconds=5).put_once("weak", b"z"),
        "change bucket lock": lambda: client.put_object_lock_configuration(
            Bucket=bucket, ObjectLockConfiguration={"ObjectLockEnabled": "Enabled"}),
        "other bucket": lambda: client.list_objects_v2(Bucket=f"{bucket}-other"),
        "new bucket": lambda: client.create_bucket(Bucket=f"x-{uuid.uuid4().hex[:12]}"),
    }
    for what, attempt in attempts.items():
        with pytest.raises(ClientError) as refused:
            attempt()
            pytest.fail(f"{what} was allowed")
        assert code(refused.value) in DENIED, f"{what}: {code(refused.value)}"
    root = s3_client(minio_endpoint)
    assert root.get_object(Bucket=bucket, Key="k")["Body"].read() == b"x"
    assert root.get_object_retention(Bucket=bucket, Key="g")["Retention"]["RetainUntilDate"] > soon


def test_put_object_retention_is_needed_for_locked_puts(minio_endpoint: str, policies) -> None:  # noqa: F811
    """Why the writer holds s3:PutObjectRetention: without it MinIO refuses every audit put."""
    bucket, documents = policies
    policy = json.loads(json.dumps(documents["entroloop-audit-writer"]))
    policy["Statement"] = [s for s in policy["Statement"] if "s3:PutObjectRetention" not in s["Action"]]
    client = client_with_policy(minio_endpoint, policy)
    with pytest.raises(ClientError) as refused:
        S3WormStore(client, bucket, lock_mode="COMPLIANCE", retention_days=1, retry_seconds=5).put_once("k", b"x")
    assert code(refused.value) in DENIED


def test_the_reader_only_reads(minio_endpoint: str, policies) -> None:  # noqa: F811
    bucket, documents = policies
    S3WormStore(s3_client(minio_endpoint), bucket, lock_mode="GOVERNANCE", retention_days=1).put_once("k", b"x")
    reader = S3WormStore(client_with_policy(minio_endpoint, documents["entroloop-audit-reader"]), bucket,
                         lock_mode="GOVERNANCE", retention_days=1, retry_seconds=5)
    assert reader.get("k") == b"x" and reader.list() == ["k"]
    with pytest.raises(ClientError) as refused:
        reader.put_once("forged", b"y")
    assert code(refused.value) in DENIED
