"""Real broker -> `entroloop sink audit` (subprocess) -> MinIO with Object Lock: the actions topic is
written to the write-once log next to the audit topic, in chains of its own, locked by the server,
verified clean, and read back by alert key and action id. The sink is first SIGKILLed right after a
durable write (before its offset commit) and restarted with another batch size: the write journal
makes the redelivered range land on the same objects, so nothing is stored twice."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from botocore.exceptions import ClientError
from entroloop.sinks.audit.verify import verify_store

from entroloop.contract import codec
from entroloop.contract.records import Action, Audit
from entroloop.contract.topics import partition_for
from entroloop.infra.kafka_topics import ensure_topics
from entroloop.infra.worm.reader import find_actions
from entroloop.infra.worm.s3_store import S3WormStore
from tests.integration.conftest import REPO_ROOT
from tests.integration.minio_fixtures import (  # noqa: F401  (fixtures)
    ACCESS_KEY,
    SECRET_KEY,
    locked_bucket,
    minio_endpoint,
)
from tests.unit.sinks.action_records import sample_actions
from tests.unit.sinks.sink_records import sample_records
from tests.integration.acknowledged_producer import AcknowledgedProducer

pytestmark = [pytest.mark.kafka, pytest.mark.minio]

PARTITIONS = 2


def _publish(bootstrap: str, prefix: str, records: list) -> None:
    ensure_topics(bootstrap, prefix, PARTITIONS)
    producer = AcknowledgedProducer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for r in records:
        producer.produce(prefix + r.topic, key=r.request_id.encode(), value=codec.encode(r),
                         partition=partition_for(r.request_id, PARTITIONS))
    assert producer.flush(60) == 0, "the broker did not acknowledge every record"


def _run_audit_sink(bootstrap: str, prefix: str, endpoint: str, bucket: str, data_dir: Path, batch_rows: int,
                    fault_after: int = 0) -> subprocess.CompletedProcess:
    shared = endpoint == os.environ.get("ENTROLOOP_S3_ENDPOINT")
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENTROLOOP_")}
    env.update({
        "ENTROLOOP_KAFKA_BOOTSTRAP": bootstrap, "ENTROLOOP_TOPIC_PREFIX": prefix, "ENTROLOOP_PARTITIONS": str(PARTITIONS),
        "ENTROLOOP_DATA_DIR": str(data_dir), "ENTROLOOP_AUDIT_STORE": "s3", "ENTROLOOP_S3_ENDPOINT": endpoint,
        "ENTROLOOP_S3_BUCKET": bucket, "ENTROLOOP_AUDIT_LOCK_MODE": "GOVERNANCE", "ENTROLOOP_AUDIT_RETENTION_DAYS": "1",
        "ENTROLOOP_S3_ACCESS_KEY": os.environ.get("ENTROLOOP_S3_ACCESS_KEY", ACCESS_KEY) if shared else ACCESS_KEY,
        "ENTROLOOP_S3_SECRET_KEY": os.environ.get("ENTROLOOP_S3_SECRET_KEY", SECRET_KEY) if shared else SECRET_KEY,
    })
    if fault_after:
        env["ENTROLOOP_FAULT_KILL_AFTER_WRITE"] = str(fault_after)
    return subprocess.run(
        [sys.executable, "-m", "entroloop.cli", "sink", "audit", "--until-empty", "--json", "--session-timeout-s", "6",
         "--batch-rows", str(batch_rows), "--batch-seconds", "0.5"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )


def test_audit_sink_stores_action_records_in_the_object_lock_store(
    kafka_bootstrap, topic_prefix, locked_bucket, minio_endpoint, tmp_path  # noqa: F811  (fixtures)
):
    client, bucket = locked_bucket
    audits = sample_records(40, seed=61)[Audit.topic]
    actions = sample_actions(90, alerts=9)
    _publish(kafka_bootstrap, topic_prefix, [*audits, *actions])

    killed = _run_audit_sink(kafka_bootstrap, topic_prefix, minio_endpoint, bucket, tmp_path, 10, fault_after=3)
    assert killed.returncode == -9, f"the fault hook should have killed the sink:\n{killed.stderr[-2000:]}"
    done = _run_audit_sink(kafka_bootstrap, topic_prefix, minio_endpoint, bucket, tmp_path, 25)
    assert done.returncode == 0, done.stderr[-3000:]
    stats = json.loads(done.stdout.strip().splitlines()[-1])
    print(f"\naudit sink after the kill: {stats}")

    store = S3WormStore(client, bucket, lock_mode="GOVERNANCE", retention_days=1)
    report = verify_store(store)
    assert report.ok, [str(p) for p in report.problems]
    # every record once: a second copy of a redelivered range would be an overlapping batch (or more records)
    assert report.records_by_topic == {Audit.topic: len(audits), Action.topic: len(actions)}
    action_files = store.list("actions/")
    assert action_files and {k.split("/")[1].split("=")[0] for k in action_files} == {"action"}
    assert {k.split("/")[1] for k in store.list("heads/")} >= {f"{Action.topic}-p000", f"{Action.topic}-p001"}

    one = actions[17]
    rows = list(find_actions(store, "alert_key", one.alert_key))
    assert sorted(r["action_id"] for r in rows) == sorted(a.action_id for a in actions if a.alert_key == one.alert_key)
    assert [r["event_id"] for r in find_actions(store, "action_id", one.action_id)] == [one.event_id]

    # the server holds the action files under Object Lock: deleting a locked version is refused
    key = action_files[0]
    assert client.get_object_retention(Bucket=bucket, Key=key)["Retention"]["Mode"] == "GOVERNANCE"
    version = client.head_object(Bucket=bucket, Key=key)["VersionId"]
    with pytest.raises(ClientError):
        client.delete_object(Bucket=bucket, Key=key, VersionId=version)
