"""``entroloop train`` and ``entroloop adapters`` end to end, as processes (tiny model, CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import msgspec
import pytest

from tests.integration.training_fixtures import (
    correction_records,
    replay_pairs,  # noqa: F401 - fixture
    retrain_request,
    tiny_base_model,  # noqa: F401 - fixture
    write_jsonl,
)

pytestmark = pytest.mark.training

REPO = Path(__file__).resolve().parents[2]


def _entroloop(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, "-m", "entroloop.cli", *args], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_train_command_registers_once_and_adapters_commands_read_it(tmp_path, tiny_base_model, replay_pairs):
    records = write_jsonl(correction_records(replay_pairs), tmp_path / "records.jsonl")
    request = tmp_path / "request.json"
    request.write_bytes(msgspec.json.encode(retrain_request("cli-key")))
    # The embedded mode: `make test` exports the test broker's ENTROLOOP_KAFKA_BOOTSTRAP, which
    # would switch the commands to Kafka, so no ENTROLOOP_ variable is inherited.
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("ENTROLOOP_")}
    env = {
        **inherited, "PYTHONPATH": str(REPO), "ENTROLOOP_DATA_DIR": str(tmp_path / "data"),
        "ENTROLOOP_BASE_MODEL_PATH": str(tiny_base_model), "ENTROLOOP_TRAIN_MAX_STEPS": "150",
        "ENTROLOOP_TRAIN_BATCH_ROWS": "4", "ENTROLOOP_TRAIN_SEQ_LEN": "128", "ENTROLOOP_TRAIN_LEARNING_RATE": "0.02",
        "ENTROLOOP_TRAIN_REPLAY_RATIO": "0.5", "ENTROLOOP_TRAIN_CPU_THREADS": "1", "ENTROLOOP_GATE_EXTRA_TOKENS": "0",
    }
    first = _entroloop(env, "train", "--request", str(request), "--records", str(records))
    summary = json.loads(first.stdout)
    assert summary["state"] == "accepted", first.stdout + first.stderr
    adapter_id = summary["adapter_id"]

    again = _entroloop(env, "train", "--request", str(request), "--records", str(records))
    assert "no second job started" in again.stderr
    assert json.loads(again.stdout)["adapter_id"] == adapter_id

    # The consumer: the same trigger redelivered on the bus starts no job; its offset is committed.
    from entroloop.contract.codec import encode
    from entroloop.infra.bus import LocalLog

    bus = LocalLog(tmp_path / "data" / "log", 6)
    redelivered = retrain_request("cli-key")
    bus.append(redelivered.topic, redelivered.request_id, encode(redelivered), redelivered.event_id)
    bus.close()
    consumed = _entroloop(env, "trainer", "--once")
    assert consumed.stdout.strip() == ""  # no job summary: no job ran
    offsets = json.loads((tmp_path / "data" / "training" / "offsets.json").read_text())
    assert sum(offsets.values()) == 1

    listed = [json.loads(line) for line in _entroloop(env, "adapters", "list", "--json").stdout.splitlines()]
    assert [(r["adapter_id"], r["status"]) for r in listed] == [(adapter_id, "candidate")]
    assert adapter_id in _entroloop(env, "adapters", "list").stdout
    shown = json.loads(_entroloop(env, "adapters", "show", adapter_id).stdout)
    assert shown["adapter_id"] == adapter_id and shown["metrics"]["gate"]["accepted"] is True
    assert all(len(f["sha256"]) == 64 for f in shown["files"].values())
    _entroloop(env, "adapters", "rollback", adapter_id)
    shown = json.loads(_entroloop(env, "adapters", "show", adapter_id).stdout)
    assert [h["status"] for h in shown["history"]] == ["candidate", "rolled_back"]

    # Every step went to the embedded bus's actions topic (for the ClickHouse and audit sinks).
    from entroloop.contract.codec import decode
    from entroloop.contract.records import Action

    log = LocalLog(tmp_path / "data" / "log", 6)
    actions = [decode(v) for p in range(6) for _k, v in log.read(Action.topic, p, 0, log.end_offset(Action.topic, p))]
    names = {a.action for a in actions}
    assert {"retrain.claimed", "train.completed", "gate.completed", "adapter.registered", "retrain.duplicate",
            "canary.rolled_back"} <= names
    # `train` run again by hand and the consumer's redelivery: each a duplicate, neither a job.
    assert [a.action for a in actions].count("retrain.duplicate") == 2
    assert [a.action for a in actions].count("retrain.claimed") == 1
