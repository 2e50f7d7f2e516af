"""The retraining loop's audit trail: every step ``ActionLog`` records, emitted through the embedded
bus, ends up in the write-once audit log and is read back there by its subject (light: no torch,
the ActionLog and the embedded runner are enough)."""

from __future__ import annotations

import json

from entroloop.sinks.audit.verify import verify_store
from entroloop.training.actions import RUNBOOK, ActionLog

from entroloop.contract.records import Action
from entroloop.contract.settings import Settings
from entroloop.infra.worm.reader import find_actions
from entroloop.runner import EmbeddedRunner

STEPS = ("job.claimed", "dataset.built", "train.completed", "gate.accepted", "adapter.registered",
         "adapter.loaded", "canary.stage", "canary.stage", "adapter.promoted")


def test_action_log_steps_reach_the_worm_log_through_the_embedded_bus(chdb_dsn, ch_database, tmp_path):
    settings = Settings(data_dir=tmp_path, clickhouse_dsn=chdb_dsn, clickhouse_database=ch_database,
                        audit_store="local", partitions=3)
    runner = EmbeddedRunner(settings, processors=[])
    log = ActionLog(emit=runner.publish)
    for i, step in enumerate(STEPS):
        log.record(step, "lora-support-7", stage=i)
    log.record("job.claimed", "other-trigger")
    runner.drain()

    rows = sorted(find_actions(runner.audit.store, "alert_key", "lora-support-7"), key=lambda r: r["seq"])
    assert [r["action"] for r in rows] == list(STEPS)
    assert [r["action_id"] for r in rows] == [r.action_id for r in log.records[: len(STEPS)]]
    assert all(r["runbook"] == RUNBOOK and r["outcome"] == "ok" for r in rows)
    assert [json.loads(r["detail"])["stage"] for r in rows] == list(range(len(STEPS)))
    one = log.records[-1]
    assert [r["alert_key"] for r in find_actions(runner.audit.store, "action_id", one.action_id)] == ["other-trigger"]
    report = verify_store(runner.audit.store)
    assert report.ok and report.records_by_topic == {Action.topic: len(STEPS) + 1}, report.problems
    runner.close()
