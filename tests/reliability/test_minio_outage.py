"""MinIO stops and restarts while `entroloop sink audit` writes to it (S3 with Object Lock): the
sink's writes wait and retry, and the log ends with every (node_id, seq) exactly once, verified.

The MinIO server is this test's own (``MinioServer`` from the integration fixtures), so the shared
one keeps serving other tests. The sink runs with ``--until-empty``: with ``--max-idle-s`` it would
exit while paused on backpressure during the outage (time paused counts as idle), with rows still
buffered and unwritten (not lost: their offsets are not committed, a restart reads them again).
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from pathlib import Path

from entroloop.sinks.audit.verify import verify_store

from entroloop.contract import codec
from entroloop.contract.records import Audit
from entroloop.contract.topics import partition_for
from entroloop.infra.kafka_topics import ensure_topics
from entroloop.infra.worm.s3_store import S3WormStore, make_s3_client
from tests.integration.acknowledged_producer import AcknowledgedProducer
from tests.integration.minio_fixtures import (
    ACCESS_KEY,
    SECRET_KEY,
    MinioServer,
    minio_binary,
)
from tests.reliability.harness import (
    PYTHON,
    REPO_ROOT,
    Figures,
    audit_identities,
    check_exactly_once,
    fleet_records,
    identity,
    report,
    sink_env,
    wait_for,
)

PARTITIONS = 2
BUCKET = "audit-outage"
PUBLISH_SECONDS = 10.0


def test_minio_stopped_and_restarted_during_audit_writes(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    minio = MinioServer(minio_binary(), tmp_path / "minio" / "data")
    minio.start()
    sink = None
    try:
        ensure_topics(kafka_bootstrap, topic_prefix, PARTITIONS)
        audits = [r for r in fleet_records(600, seed=91) if isinstance(r, Audit)]
        env = sink_env(kafka_bootstrap, topic_prefix, tmp_path / "sink", PARTITIONS,
                       ENTROLOOP_AUDIT_STORE="s3", ENTROLOOP_S3_ENDPOINT=minio.endpoint, ENTROLOOP_S3_BUCKET=BUCKET,
                       ENTROLOOP_S3_ACCESS_KEY=ACCESS_KEY, ENTROLOOP_S3_SECRET_KEY=SECRET_KEY,
                       ENTROLOOP_AUDIT_LOCK_MODE="GOVERNANCE", ENTROLOOP_AUDIT_RETENTION_DAYS="1",
                       ENTROLOOP_S3_RETRY_SECONDS="120")
        sink = subprocess.Popen(
            [PYTHON, "-m", "entroloop.cli", "sink", "audit", "--create-bucket", "--json", "--session-timeout-s", "6",
             "--batch-rows", "20", "--batch-seconds", "0.2", "--until-empty"],
            cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        producer = AcknowledgedProducer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True, "linger.ms": 5})

        def publish_steadily() -> None:
            started = time.monotonic()
            for i, r in enumerate(audits):
                ahead = i * PUBLISH_SECONDS / len(audits) - (time.monotonic() - started)
                if ahead > 0:
                    time.sleep(ahead)
                producer.produce(topic_prefix + r.topic, key=r.request_id.encode(), value=codec.encode(r),
                                 partition=partition_for(r.request_id, PARTITIONS))
                producer.poll(0)
            assert producer.flush(60) == 0

        publisher = threading.Thread(target=publish_steadily, daemon=True)
        publisher.start()
        client = make_s3_client(minio.endpoint, "us-east-1", ACCESS_KEY, SECRET_KEY)
        store = S3WormStore(client, BUCKET, lock_mode="GOVERNANCE", retention_days=1, retry_seconds=120)

        def objects() -> int:
            try:
                return len(store.list("audit/"))
            except Exception:  # noqa: BLE001 - the bucket may not exist yet
                return 0

        wait_for(lambda: objects() >= 3, 90, 0.2, "the sink's first audit objects")
        minio.stop()
        time.sleep(4.0)
        minio.start()
        back_at = time.monotonic()
        publisher.join(timeout=120)
        sent = [identity(a) for a in audits]
        deadline = time.monotonic() + 120
        while len(audit_identities(store)) < len(sent) and time.monotonic() < deadline and sink.poll() is None:
            time.sleep(0.5)
        if len(audit_identities(store)) < len(sent):
            sink.kill()
            out, err = sink.communicate(timeout=30)
            raise AssertionError(f"{len(audit_identities(store))} of {len(sent)} audit records in MinIO; sink exit "
                                 f"{sink.returncode}:\n{out[-1000:]}\n{err[-4000:]}")
        recovery_s = time.monotonic() - back_at
        out, err = sink.communicate(timeout=120)
        assert sink.returncode == 0, err[-3000:]
        stored = audit_identities(store)
        counters = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
        unique, twice, lost = check_exactly_once(sent, stored, "audit (MinIO)")
        verdict = verify_store(store)
        report(Figures(
            "MinIO stopped 4 s and restarted during audit writes",
            sent=len(sent),
            stored={"audit (MinIO, Object Lock)": unique},
            duplicates_absorbed=0,
            lost=lost,
            recovery_s=recovery_s,
            note=f"sink: {counters.get('writes')} writes, {counters.get('pauses')} backpressure pauses while MinIO "
            f"was down, {counters.get('messages')} messages fetched (re-fetched after each pause); "
            f"verify: {verdict.batches} batches, {verdict.files} files",
        ))
        assert lost == 0 and twice == 0
        assert verdict.ok, [str(p) for p in verdict.problems]
    finally:
        if sink is not None and sink.poll() is None:
            sink.kill()
            sink.wait(10)
        minio.stop()
