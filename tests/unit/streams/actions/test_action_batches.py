"""The action runner on a burst of alerts handled as one batch (``ActionRunner.process_batch``), as
``entroloop actions`` hands it what one poll fetched: the same decisions as one alert at a time
(once per alert key, the same rate-limit slots, byte-identical records), webhooks of different
targets at once but never more than ``concurrency``, those of one target in the alerts' order."""

from __future__ import annotations

from entroloop.streams.actions import (
    ActionRunner,
    ActionState,
    WebhookClient,
    parse_runbook,
)
from entroloop.streams.actions.state import DUPLICATE, RATE_LIMITED, RUN, Claim

from entroloop.contract.ids import derived_event_id
from entroloop.contract.records import Action, Alert

AT = 1_790_000_000.0
RUNBOOK = """
name: fallback-burst
version: 3
match: {rules: [fallback_circuit_breaker]}
rate_limit: {max: 5, per_s: 600}
steps:
  - kind: switch_fallback
"""


def _alert(n: int, key: int, route: str = "") -> Alert:
    """Alert number ``n`` (its own event) about finding ``key`` (alerts about one finding share the key)."""
    return Alert(event_id=derived_event_id(f"alert-{n}", "alert", at=AT + n), emitted_at=AT + n, node_id="worker",
                 seq=n, request_id=f"req-{n}", alert_key=f"fallback_circuit_breaker:finding-{key}",
                 rule="fallback_circuit_breaker", severity="critical", model="m", route=route or f"route-{key}",
                 subject_node="node-1", value=0.9, threshold=0.5)


def _runner(receiver, runbook_text: str = RUNBOOK, concurrency: int = 8) -> ActionRunner:
    return ActionRunner([parse_runbook(runbook_text)], ActionState(), endpoints={"gateway": receiver.url},
                        webhook=WebhookClient(attempts=1), clock=lambda: AT, concurrency=concurrency)


def _burst() -> list[Alert]:
    """20 findings alerted twice each, the repeat 20 alerts later (the same batch)."""
    return [_alert(n, n % 20) for n in range(40)]


def test_a_burst_acts_once_per_key_within_the_rate_limit_like_one_at_a_time(receiver):
    batch_runner = _runner(receiver)
    batched = batch_runner.process_batch(_burst())

    called = [r.headers["Idempotency-Key"] for r in receiver.requests]
    assert len(called) == 5 == len(set(called))  # the rate limit's 5, each once
    actions = [r for r in batched if isinstance(r, Action)]
    assert sorted(a.alert_key for a in actions) == sorted({a.alert_key for a in _burst()})  # one per finding
    assert [a.outcome for a in actions] == ["ok"] * 5 + ["rate_limited"] * 15  # slots go in the alerts' order
    assert set(called) == {a.action_id for a in actions if a.outcome == "ok"}
    assert batch_runner.counters["duplicates"] == 20
    assert batch_runner.process_batch(_burst()) == []  # redelivered: every decision is final

    receiver.requests.clear()
    one_by_one = _runner(receiver)
    single = [record for alert in _burst() for record in one_by_one.process(alert)]
    assert [(r.event_id, r.outcome) for r in single] == [(r.event_id, r.outcome) for r in batched]
    assert len(receiver.requests) == 5


def test_a_batchs_webhooks_run_at_once_up_to_the_bound_and_in_order_per_target(receiver):
    receiver.delay_s = 0.1
    unlimited = RUNBOOK.replace("rate_limit: {max: 5, per_s: 600}\n", "")
    runner = _runner(receiver, unlimited, concurrency=3)
    same_target = [_alert(100 + n, 100 + n, route="busy-route") for n in range(4)]
    alerts = [_alert(n, n) for n in range(8)]
    alerts[2:2] = same_target  # interleaved with the others

    out = runner.process_batch(alerts)

    assert len(out) == len(alerts) == len(receiver.requests)
    assert 1 < receiver.max_in_flight <= 3
    busy = [r.body["alert_key"] for r in receiver.requests if r.path == "/admin/routes/busy-route/tier"]
    assert busy == [a.alert_key for a in same_target]
    assert [r.alert_key for r in out] == [a.alert_key for a in alerts]  # records in the alerts' order


def test_decisions_of_a_batch_are_one_transaction_in_order(tmp_path):
    state = ActionState(tmp_path / "state.sqlite")
    assert state.claim("rb", "done-before", "live", "1", AT - 3600)
    state.finish("rb", "done-before", "live", "ok", AT - 3600)
    limit = (2, 60.0)
    claims = [Claim("rb", "a", "live", "1", limit), Claim("rb", "a", "live", "1", limit),  # asked twice
              Claim("rb", "done-before", "live", "1", limit), Claim("rb", "b", "live", "1", limit),
              Claim("rb", "c", "live", "1", limit), Claim("rb", "c", "dry_run", "1", limit)]
    assert state.decide(claims, AT) == [RUN, DUPLICATE, DUPLICATE, RUN, RATE_LIMITED, RUN]
    reopened = ActionState(tmp_path / "state.sqlite")
    # claimed but not finished (a crash): may run again; the rate window still counts the two slots
    assert reopened.decide([Claim("rb", "a", "live", "1", limit)], AT + 1) == [RATE_LIMITED]
    assert reopened.decide([Claim("rb", "a", "live", "1", limit)], AT + 61) == [RUN]
