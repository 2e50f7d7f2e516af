"""Alert actions end to end in the embedded runner: alerts in, every repository runbook executed
against a real local webhook receiver, and each step's Action record found in the write-once
audit log (through its manifests, by alert key and by action id), the same records as in the
ClickHouse ``actions`` table; replay and a crash with a longer re-cut store nothing twice."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from entroloop.sinks.audit.verify import verify_store
from entroloop.streams.actions import load_runbooks
from entroloop.streams.actions.runbooks import BUILTIN_RUNBOOKS_DIR

from entroloop.contract.ids import derived_event_id
from entroloop.contract.records import (
    Action,
    Alert,
    Audit,
    Span,
    TokenEntropy,
    pack_entropies,
)
from entroloop.contract.settings import Settings
from entroloop.infra.worm.reader import find_actions
from entroloop.runner import EmbeddedRunner

REPO = Path(__file__).resolve().parents[2]
RUNBOOKS = load_runbooks(BUILTIN_RUNBOOKS_DIR)
ADAPTER = "lora-support-7"


def _settings(tmp_path: Path, chdb_dsn: str, database: str, **values) -> Settings:
    return Settings(**{"data_dir": tmp_path / "data", "clickhouse_dsn": chdb_dsn, "clickhouse_database": database,
                       "audit_store": "local", "partitions": 2, **values})


def _alert_with_evidence(rule: str, severity: str, n: int, at: float) -> list:
    """One alert and the alerted request's tokens (served by ADAPTER), span and audit record."""
    request_id = f"req-{rule}-{n}"
    common = {"emitted_at": at, "node_id": "node-2", "seq": n, "request_id": request_id, "trace_id": f"{n:032x}"}
    return [
        TokenEntropy(event_id=derived_event_id(request_id, "t", at=at), **common, model="qwen-7b", route="support",
                     adapter=ADAPTER, entropies=pack_entropies([0.5, 5.1, 5.3, 5.0])),
        Span(event_id=derived_event_id(request_id, "s", at=at), **common, span_id=f"{n:016x}", name="llm_request",
             start_time=at, end_time=at + 1, model="qwen-7b", route="support", ttft_s=0.1, tpot_s=0.02, e2e_s=1.0),
        Audit(event_id=derived_event_id(request_id, "a", at=at), **common, audit_id=f"aud-{n}", model="qwen-7b",
              route="support", adapter=ADAPTER, prompt="p", response="r"),
        Alert(event_id=derived_event_id(request_id, "alert", rule, at=at), **{**common, "node_id": "detector"},
              alert_key=f"{rule}:{request_id}", rule=rule, severity=severity, model="qwen-7b", route="support",
              subject_node="node-2", token_start=1, token_end=3, value=5.2, threshold=4.5),
    ]


def _digests(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in root.rglob("*") if p.is_file()}


def test_each_runbook_executed_with_its_action_records_in_the_worm_audit_log(receiver, chdb_dsn, ch_database, tmp_path):
    settings = _settings(tmp_path, chdb_dsn, ch_database, actions_dry_run=False,
                         actions_gateway_url=receiver.url + "/gw", actions_vllm_url=receiver.url + "/vllm",
                         actions_webhook_backoff_s=0.01)
    runner = EmbeddedRunner(settings)  # default wiring: the action runner joins when runbooks exist
    assert any(p.name == "alert_actions" for p in runner.processors)
    at = time.time() - 3600
    alerts: dict[str, Alert] = {}
    for n, runbook in enumerate(RUNBOOKS):
        severity = runbook.match.severities[0] if runbook.match.severities else "warning"
        for record in _alert_with_evidence(runbook.match.rules[0], severity, n, at + n):
            runner.publish(record)
            if isinstance(record, Alert):
                alerts[runbook.name] = record
    runner.drain()
    store = runner.audit.store

    for runbook in RUNBOOKS:
        alert = alerts[runbook.name]
        rows = sorted(find_actions(store, "alert_key", alert.alert_key), key=lambda r: r["seq"])
        assert [r["action"] for r in rows] == [s.kind for s in runbook.steps], runbook.name
        assert all(r["outcome"] == "ok" and not r["dry_run"] for r in rows), [r["detail"] for r in rows]
        assert {(r["runbook"], r["runbook_version"]) for r in rows} == {(runbook.name, runbook.version)}
        assert all(r["_object"].startswith(f"actions/action={r['action']}/") for r in rows)
        for row in rows:  # each one found again by its own id, once
            assert [r["event_id"] for r in find_actions(store, "action_id", row["action_id"])] == [row["event_id"]]
    posts = len(receiver.requests)
    assert posts == sum(1 for r in RUNBOOKS for s in r.steps if s.kind not in ("capture_bundle", "open_retrain"))

    # the log holds exactly what the actions table holds, and verifies clean
    table = runner.clickhouse.client.query(
        f"SELECT action_id FROM {ch_database}.actions FINAL").result_rows
    report = verify_store(store)
    assert report.ok, report.problems
    assert report.records_by_topic[Action.topic] == len(table) >= sum(len(r.steps) for r in RUNBOOKS)
    assert report.records_by_topic[Audit.topic] == len(RUNBOOKS)

    # replay: every topic re-read, no webhook sent again, no audit or action file written anew
    before = _digests(runner.audit.store.root)
    written = runner.audit.files_written
    runner.rewind()
    runner.drain()
    assert runner.audit.files_written == written and _digests(runner.audit.store.root) == before
    assert len(receiver.requests) == posts
    runner.close()


def _action(n: int, at: float) -> Action:
    return Action(event_id=derived_event_id("adapter-1", "step", str(n), at=at), emitted_at=at, node_id="trainer",
                  seq=n, request_id="adapter-1", action_id=f"step-{n}", action="canary.stage", alert_key="adapter-1",
                  outcome="ok")


def test_a_longer_cut_after_a_lost_commit_writes_only_the_new_actions(chdb_dsn, ch_database, tmp_path):
    """Actions are a derived topic: it grows while the log drains, so after a crash between the
    durable write and the offset commit the same offsets come back in a longer batch. The chain
    keeps the records it holds and takes the rest as the next batch: each record once, intact."""
    runner = EmbeddedRunner(_settings(tmp_path, chdb_dsn, ch_database, partitions=1), processors=[])
    at = time.time() - 600
    for n in range(3):
        runner.publish(_action(n, at + n))
    runner.drain()
    runner.rewind()  # the offsets are lost, as if the process died before committing them
    for n in range(3, 5):
        runner.publish(_action(n, at + n))
    runner.drain()  # re-reads 0..4 as one batch; 0..2 are chained already
    store = runner.audit.store
    assert [k.rsplit("/", 1)[1] for k in store.list("manifests/")] == [
        f"{Action.topic}-p000-000000000000-000000000002.json", f"{Action.topic}-p000-000000000003-000000000004.json"]
    rows = list(find_actions(store, "alert_key", "adapter-1"))
    assert sorted(r["action_id"] for r in rows) == [f"step-{n}" for n in range(5)]
    report = verify_store(store)
    assert report.ok and report.records_by_topic == {Action.topic: 5}, report.problems
    runner.close()
