"""The distributed loop end to end, as processes: a retrain request on the real broker, consumed by
`entroloop trainer --once`, trains a real LoRA adapter (tiny model, CPU) on bad cases read from
ClickHouse (chDB) and accepted answers read back from the WORM audit log by audit id, registers it,
and publishes every step to the actions topic. The data set equals the one built from the records
themselves, so the warehouse round trip loses and adds nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from entroloop.training.dataset import build_dataset
from entroloop.training.pipeline import select_training_records

from entroloop.contract import codec
from entroloop.contract.records import Action, RetrainRequest
from entroloop.contract.settings import Settings
from entroloop.contract.topics import TOPIC_BY_TYPE
from entroloop.infra.kafka_topics import ensure_topics
from tests.integration.acknowledged_producer import AcknowledgedProducer
from tests.integration.test_publisher_kafka import consume_all
from tests.integration.training_fixtures import (
    correction_records,
    replay_pairs,  # noqa: F401 - fixture
    retrain_request,
    tiny_base_model,  # noqa: F401 - fixture
    write_jsonl,
)

pytestmark = [pytest.mark.training, pytest.mark.kafka]

REPO = Path(__file__).resolve().parents[2]

# Written in a process of its own: chDB lets one process at a time open a data folder, and the
# trainer's process opens this one next.
POPULATE = """
import sys
from pathlib import Path
import msgspec
from entroloop.contract.records import AnyRecord, Audit
from entroloop.sinks.audit.parquet_writer import AuditParquetWriter
from entroloop.infra.worm.worm_store import LocalWormStore
from entroloop.infra.clickhouse.client import connect
from entroloop.sinks.clickhouse.writer import ClickHouseSink

dsn, worm, records = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
decoder = msgspec.json.Decoder(AnyRecord)
by_topic = {}
for line in records.read_bytes().splitlines():
    record = decoder.decode(line)
    by_topic.setdefault(record.topic, []).append(record)
sink = ClickHouseSink(connect(dsn), "entroloop")
for topic, items in by_topic.items():
    sink.write(topic, 0, 0, len(items) - 1, items)
audits = by_topic[Audit.topic]
AuditParquetWriter(LocalWormStore(worm)).write(Audit.topic, 0, 0, len(audits) - 1, audits)
"""


def test_retrain_request_on_kafka_trains_from_clickhouse_and_the_audit_log(
        kafka_bootstrap, topic_prefix, tmp_path, tiny_base_model, replay_pairs) -> None:
    data = tmp_path / "data"
    records = correction_records(replay_pairs)
    jsonl = write_jsonl(records, tmp_path / "records.jsonl")
    dsn = f"chdb://{data / 'chdb'}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENTROLOOP_")}
    env.update({
        "PYTHONPATH": str(REPO), "ENTROLOOP_DATA_DIR": str(data), "ENTROLOOP_NODE_ID": "trainer-e2e",
        "ENTROLOOP_KAFKA_BOOTSTRAP": kafka_bootstrap, "ENTROLOOP_TOPIC_PREFIX": topic_prefix,
        "ENTROLOOP_PARTITIONS": "2", "ENTROLOOP_CLICKHOUSE_DSN": dsn, "ENTROLOOP_CLICKHOUSE_DATABASE": "entroloop",
        "ENTROLOOP_AUDIT_STORE": "local",
        "ENTROLOOP_BASE_MODEL_PATH": str(tiny_base_model), "ENTROLOOP_TRAIN_MAX_STEPS": "150",
        "ENTROLOOP_TRAIN_BATCH_ROWS": "4", "ENTROLOOP_TRAIN_SEQ_LEN": "128", "ENTROLOOP_TRAIN_LEARNING_RATE": "0.02",
        "ENTROLOOP_TRAIN_REPLAY_RATIO": "0.5", "ENTROLOOP_TRAIN_CPU_THREADS": "1", "ENTROLOOP_GATE_EXTRA_TOKENS": "0",
    })
    populated = subprocess.run([sys.executable, "-c", POPULATE, dsn, str(data / "worm"), str(jsonl)], cwd=REPO,
                               env=env, capture_output=True, text=True, timeout=300)
    assert populated.returncode == 0, populated.stdout + populated.stderr

    request = retrain_request("e2e-kafka-key")
    ensure_topics(kafka_bootstrap, topic_prefix, 2, topics=[TOPIC_BY_TYPE[RetrainRequest]])
    producer = AcknowledgedProducer({"bootstrap.servers": kafka_bootstrap})
    producer.produce(topic_prefix + RetrainRequest.topic, key=request.request_id.encode(), value=codec.encode(request))
    assert producer.flush(30) == 0

    trainer = subprocess.run([sys.executable, "-m", "entroloop.cli", "trainer", "--once"], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=900)
    assert trainer.returncode == 0, trainer.stdout + trainer.stderr

    [status_file] = (data / "training" / "jobs").glob("*/status.json")
    status = json.loads(status_file.read_text())
    assert status["state"] == "accepted", status
    results = status["results"]
    assert results["gate"]["accepted"] is True and results["register"]["adapter_id"]
    # the same data set as built from the records themselves: nothing lost or changed on the way
    settings = Settings(train_replay_ratio=0.5)
    expected = build_dataset(*select_training_records(records, request), replay_ratio=0.5,
                             heldout_fraction=settings.train_heldout_fraction,
                             negative_rating=settings.badcase_negative_rating, seed=request.trigger_key)
    assert results["dataset"]["dataset_digest"] == expected.digest
    assert {k: results["dataset"][k] for k in expected.stats} == expected.stats
    assert expected.stats["corrections"] == 90 and expected.stats["replay"] > 20
    saved = json.loads((status_file.parent / "work" / "dataset.json").read_text())
    replay_origins = {e["origin"] for e in saved["train"] + saved["heldout"] if e["source"] == "replay"}
    assert len(replay_origins) == expected.stats["replay"]
    assert replay_origins <= {f"audit-ok-{i}" for i in range(len(replay_pairs))}

    actions = [r for r in consume_all(kafka_bootstrap, [topic_prefix + Action.topic], 6, timeout=60)
               if isinstance(r, Action)]
    names = [a.action for a in sorted(actions, key=lambda a: a.seq)]
    assert {"retrain.claimed", "dataset.completed", "train.completed", "gate.completed", "adapter.registered",
            "register.completed"} <= set(names), names
    assert all(a.node_id == "trainer@trainer-e2e" for a in actions)
