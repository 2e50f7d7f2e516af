"""The action runner against a real local webhook receiver and real ClickHouse (chDB):
every repository runbook in dry run and for real, exactly once per alert key (also across a
restart), rate limits, failing webhooks retried then reported, Action records in the actions table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from entroloop.sinks.clickhouse.writer import ClickHouseSink
from entroloop.streams.actions import (
    ActionRunner,
    ActionState,
    WebhookClient,
    client_query,
    load_runbooks,
    parse_runbook,
)
from entroloop.streams.actions.runbooks import BUILTIN_RUNBOOKS_DIR

from entroloop.contract.ids import derived_event_id
from entroloop.contract.records import (
    Action,
    Alert,
    Audit,
    RetrainRequest,
    Span,
    TokenEntropy,
    pack_entropies,
)

REPO_RUNBOOKS = load_runbooks(BUILTIN_RUNBOOKS_DIR)
AT = 1_790_000_000.0
ADAPTER = "lora-support-7"


@pytest.fixture
def sink(chdb_client, ch_database):
    return ClickHouseSink(chdb_client, ch_database)


def _query(client):
    return client_query(client)


def _alert(rule: str, n: int, severity: str = "warning", request: str | None = None) -> Alert:
    request_id = request or f"req-{rule}-{n}"
    return Alert(
        event_id=derived_event_id(request_id, "alert", rule, at=AT + n),
        emitted_at=AT + n, node_id="entropy_anomaly@node-2", seq=n, request_id=request_id, trace_id=f"{n:032x}",
        alert_key=f"{rule}:{request_id}", rule=rule, severity=severity, model="qwen-7b", route="support",
        subject_node="node-2", token_start=3, token_end=40, value=5.2, threshold=4.5,
    )


def _seed(sink: ClickHouseSink, alerts: list[Alert]) -> None:
    """The alerted requests' events: tokens (served by ADAPTER), spans, audit, and the alerts."""
    tokens, spans, audits = [], [], []
    for i, a in enumerate(alerts):
        common = {"emitted_at": a.emitted_at, "node_id": "node-2", "seq": i, "request_id": a.request_id, "trace_id": a.trace_id}
        tokens.append(TokenEntropy(event_id=derived_event_id(a.request_id, "t", at=a.emitted_at), **common, model=a.model,
                                   route=a.route, adapter=ADAPTER, entropies=pack_entropies([0.5, 5.1, 5.3, 5.0])))
        spans.append(Span(event_id=derived_event_id(a.request_id, "s", at=a.emitted_at), **common, span_id=f"{i:016x}",
                          name="llm_request", start_time=a.emitted_at, end_time=a.emitted_at + 1, model=a.model,
                          route=a.route, ttft_s=0.1, tpot_s=0.02, e2e_s=1.0))
        audits.append(Audit(event_id=derived_event_id(a.request_id, "a", at=a.emitted_at), **common, audit_id=f"aud-{i}",
                            model=a.model, route=a.route, adapter=ADAPTER, prompt="p", response="r"))
    for offset, records in enumerate((tokens, spans, audits, alerts)):
        sink.write(records[0].topic, 0, offset * 1000, offset * 1000 + len(records) - 1, records)


def _runner(runbooks, state, receiver, sink, tmp_path, dry_run=False, attempts=3, waits=None) -> ActionRunner:
    return ActionRunner(
        runbooks, state,
        endpoints={"gateway": receiver.url + "/gw", "vllm": receiver.url + "/vllm"},
        webhook=WebhookClient(attempts=attempts, backoff_s=0.01, sleep=(waits.append if waits is not None else lambda s: None)),
        query=_query(sink.client), database=sink.database, bundle_dir=tmp_path / "bundles", dry_run=dry_run,
    )


EXPECTED_POSTS = {
    "pause_node": "/gw/admin/nodes/node-2/pause",
    "pause_route": "/gw/admin/routes/support/pause",
    "switch_fallback": "/gw/admin/routes/support/tier",
    "unload_adapter": f"/gw/admin/adapters/{ADAPTER}/unload",
}


@pytest.mark.parametrize("runbook", REPO_RUNBOOKS, ids=lambda r: r.name)
def test_each_repository_runbook_dry_run_then_for_real_exactly_once(runbook, receiver, sink, tmp_path):
    rule = runbook.match.rules[0]
    severity = runbook.match.severities[0] if runbook.match.severities else "warning"
    alerts = [_alert(rule, n, severity) for n in range(3)]
    _seed(sink, alerts)
    alert = alerts[-1]
    state_path = tmp_path / "state.sqlite"
    kinds = [s.kind for s in runbook.steps]

    # dry run: one Action per step saying what would happen, nothing sent, written or requested
    dry = _runner([runbook], ActionState(state_path), receiver, sink, tmp_path, dry_run=True)
    out = dry.process(alert)
    assert [r.action for r in out] == kinds
    assert all(isinstance(r, Action) and r.dry_run and r.outcome == "dry_run" for r in out)
    assert receiver.requests == [] and not (tmp_path / "bundles").exists()
    assert dry.process(alert) == []  # once per alert key in dry-run mode too

    # for real: every webhook posted once with the expected body, the bundle written, retrain emitted
    live = _runner([runbook], ActionState(state_path), receiver, sink, tmp_path)
    out = live.process(alert)
    actions = [r for r in out if isinstance(r, Action)]
    assert [a.action for a in actions] == kinds
    assert [a.outcome for a in actions] == ["ok"] * len(kinds), [a.detail for a in actions]
    assert all(not a.dry_run and a.runbook == runbook.name and a.runbook_version == runbook.version for a in actions)
    assert all(a.alert_key == alert.alert_key and a.request_id == alert.request_id for a in actions)
    assert receiver.paths() == [EXPECTED_POSTS[k] for k in kinds if k in EXPECTED_POSTS]
    for req, action in zip(receiver.requests, [a for a in actions if a.action in EXPECTED_POSTS]):
        assert req.headers["Idempotency-Key"] == action.action_id
        if action.action == "unload_adapter":
            assert req.body["lora_name"] == ADAPTER
        assert req.body["alert_key"] == alert.alert_key
    if "capture_bundle" in kinds:
        detail = json.loads(next(a for a in actions if a.action == "capture_bundle").detail)
        bundle = json.loads(Path(detail["path"]).read_text())
        assert alert.request_id in bundle["request_ids"]
        for table in ("audit_index", "token_entropy", "spans", "alerts"):
            assert {row["request_id"] for row in bundle[table]} <= set(bundle["request_ids"])
            assert any(row["request_id"] == alert.request_id for row in bundle[table]), table
        assert bundle["token_entropy"][0]["entropies"][1] == pytest.approx(5.1, abs=0.01)
    retrains = [r for r in out if isinstance(r, RetrainRequest)]
    assert len(retrains) == kinds.count("open_retrain")
    for r in retrains:
        assert r.model == alert.model and r.trigger_key.endswith(alert.alert_key)

    # the Action records land in the audit trail (actions table) once, even when written twice
    sink.write(Action.topic, 0, 0, len(out) - 1, actions)
    sink.write(Action.topic, 0, 0, len(out) - 1, actions)  # redelivery of the same batch
    stored = sink.client.query(
        f"SELECT action, outcome, runbook FROM {sink.database}.actions FINAL WHERE alert_key = '{alert.alert_key}' AND NOT dry_run"
    ).result_rows
    assert sorted(r[0] for r in stored) == sorted(kinds)

    # redelivery, and a restart with the same state file: nothing runs again
    posts = len(receiver.requests)
    assert live.process(alert) == []
    restarted = _runner([runbook], ActionState(state_path), receiver, sink, tmp_path)
    assert restarted.process(alert) == []
    assert len(receiver.requests) == posts
    # another alert key runs
    assert restarted.process(alerts[0])


FAILING = """
name: pause-then-fallback
version: 7
match: {rules: [gibberish]}
steps:
  - kind: pause_node
  - kind: switch_fallback
"""


def test_failing_webhook_is_retried_with_backoff_then_reported_and_not_silently_dropped(receiver, sink, tmp_path):
    receiver.always["/gw/admin/nodes/node-2/pause"] = 503
    waits: list[float] = []
    state = ActionState(tmp_path / "s.sqlite")
    runner = _runner([parse_runbook(FAILING)], state, receiver, sink, tmp_path, attempts=4, waits=waits)
    alert = _alert("gibberish", 1)
    failed, skipped = runner.process(alert)
    assert (failed.action, failed.outcome) == ("pause_node", "failed")
    detail = json.loads(failed.detail)
    assert detail["attempts"] == 4 and detail["status"] == 503 and detail["backoffs_s"] == [0.01, 0.02, 0.04]
    assert waits == [0.01, 0.02, 0.04]
    assert (skipped.action, skipped.outcome) == ("switch_fallback", "skipped")  # on_failure: stop
    assert receiver.paths() == ["/gw/admin/nodes/node-2/pause"] * 4
    assert runner.counters["failed"] == 1
    assert state.outcome("pause-then-fallback", alert.alert_key, "live") == "failed"
    assert runner.process(alert) == []  # reported once; the failure is final for this key


def test_missing_endpoint_is_a_reported_failure(sink, tmp_path):
    runner = ActionRunner([parse_runbook(FAILING)], ActionState(), query=_query(sink.client), database=sink.database)
    out = runner.process(_alert("gibberish", 1))
    assert out[0].outcome == "failed" and "ENTROLOOP_ACTIONS_GATEWAY_URL" in out[0].detail


def test_rate_limit_reports_instead_of_acting(receiver, sink, tmp_path):
    runbook = parse_runbook(FAILING.replace("version: 7", "version: 7\nrate_limit: {max: 2, per_s: 600}"))
    runner = _runner([runbook], ActionState(), receiver, sink, tmp_path)
    outs = [runner.process(_alert("gibberish", n)) for n in range(3)]
    assert [len(o) for o in outs] == [2, 2, 1]
    assert (outs[2][0].action, outs[2][0].outcome) == ("rate_limit", "rate_limited")
    assert len(receiver.requests) == 4
    assert runner.process(_alert("gibberish", 2)) == []  # the decision is final for that key


def test_unfinished_execution_is_resumed_with_the_same_ids(receiver, sink, tmp_path):
    """A crash between claim and finish: the alert handled again re-sends with the same
    Idempotency-Key and produces byte-identical records (so the sink and the gateway absorb it)."""
    runbook = parse_runbook(FAILING)
    alert = _alert("gibberish", 5)
    crashed = ActionState(tmp_path / "crash.sqlite")
    assert crashed.claim(runbook.name, alert.alert_key, "live", runbook.version)
    first = _runner([runbook], ActionState(tmp_path / "other.sqlite"), receiver, sink, tmp_path).process(alert)
    resumed = _runner([runbook], ActionState(tmp_path / "crash.sqlite"), receiver, sink, tmp_path).process(alert)
    assert [r.event_id for r in resumed] == [r.event_id for r in first]
    keys = [r.headers["Idempotency-Key"] for r in receiver.requests]
    assert keys[:2] == keys[2:]


def test_base_model_requests_skip_adapter_unload(receiver, sink, tmp_path):
    runbook = next(r for r in REPO_RUNBOOKS if r.name == "unload-adapter-on-entropy-shift")
    runner = _runner([runbook], ActionState(), receiver, sink, tmp_path)
    (unload, retrain_action, retrain) = runner.process(_alert("entropy_baseline_shift", 9, request="req-unseen"))
    assert (unload.action, unload.outcome) == ("unload_adapter", "skipped")
    assert receiver.requests == []
    assert retrain_action.outcome == "ok" and isinstance(retrain, RetrainRequest) and retrain.adapter == ""


def test_runner_settings_wire_runbooks_state_and_dry_run(tmp_path):
    from entroloop.contract.settings import load_settings

    settings = load_settings(data_dir=tmp_path)  # no folder configured: the packaged runbooks
    runner = ActionRunner.from_settings(settings)
    assert runner.dry_run is True  # acting for real is an explicit choice
    assert {r.name for r in runner.runbooks} == {r.name for r in REPO_RUNBOOKS}
    assert Path(runner.state.path) == tmp_path / "actions" / "state.sqlite"


def test_outbox_keeps_an_executions_records_until_delivered_and_only_when_asked(receiver, sink, tmp_path):
    from entroloop.contract.codec import decode

    runbook = next(r for r in REPO_RUNBOOKS if r.name == "fallback-on-circuit-breaker")
    alert = _alert("fallback_circuit_breaker", 1)
    plain = _runner([runbook], ActionState(tmp_path / "plain.sqlite"), receiver, sink, tmp_path)
    plain.process(alert)
    assert plain.state.outbox() == []  # the embedded runner publishes itself: nothing piles up

    state = ActionState(tmp_path / "outbox.sqlite")
    runner = _runner([runbook], state, receiver, sink, tmp_path)
    runner.outbox = True
    out = runner.process(alert)
    reopened = ActionState(tmp_path / "outbox.sqlite")  # survives the process, like the execution itself
    queued = reopened.outbox()
    assert [decode(value).event_id for _, value in queued] == [r.event_id for r in out]
    assert runner.process(alert) == [] and len(reopened.outbox()) == 1  # a duplicate queues nothing more
    reopened.delivered([entry_id for entry_id, _ in queued])
    assert state.outbox() == []
