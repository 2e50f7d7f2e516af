"""ResponseRuleChecker: alerts for compliance hits, violation counts per rule/model/route/period."""

from __future__ import annotations

from entroloop.streams.response_rules import ResponseRuleChecker

from entroloop.contract.records import Alert, Health

from .analytics_records import audit


def _by_metric(records: list, metric: str) -> dict[tuple[str, str, str], float]:
    return {
        (r.labels["model"], r.labels.get("rule", ""), r.labels["window_start"]): r.value
        for r in records
        if isinstance(r, Health) and r.metric == metric
    }


def test_compliance_hit_alerts_once_per_response() -> None:
    checker = ResponseRuleChecker()
    (alert,) = checker.process(audit("r1", response="保证收益，保证收益，零风险", model="m1"))
    assert isinstance(alert, Alert)
    assert alert.rule == "response_compliance" and alert.value == 3.0 and alert.model == "m1"
    assert checker.process(audit("r2", response="共12元")) == []  # counted, not alerted


def test_counts_per_rule_model_route_and_window_boundary() -> None:
    checker = ResponseRuleChecker(period_s=60, grace_s=5)
    checker.process(audit("a", response="共12元", model="m1", at=1020.0))       # window 1020
    checker.process(audit("b", response="共12.00元", model="m1", at=1079.999))  # window 1020
    checker.process(audit("c", response="2024-02-30 共3元", model="m1", at=1080.0))  # window 1080
    checker.process(audit("d", response="共3元", model="m2", at=1030.0))
    assert checker.on_watermark(1084.9) == []  # window [1020, 1080) waits for the grace period
    closed = checker.on_watermark(1085.0)
    checked = _by_metric(closed, "responses_checked")
    violations = _by_metric(closed, "rule_violations")
    assert checked == {("m1", "", "1020"): 2.0, ("m2", "", "1020"): 1.0}
    assert violations == {("m1", "amount_format", "1020"): 1.0, ("m2", "amount_format", "1020"): 1.0}
    later = checker.on_watermark(1145.0)
    assert _by_metric(later, "rule_violations") == {
        ("m1", "amount_format", "1080"): 1.0,
        ("m1", "date", "1080"): 1.0,
    }


def test_late_event_for_a_closed_window_is_counted_as_late() -> None:
    checker = ResponseRuleChecker(period_s=60, grace_s=0)
    checker.process(audit("a", response="x", at=1000.0))
    checker.on_watermark(1100.0)
    checker.process(audit("late", response="共1元", at=1010.0))
    assert checker.late_events == 1 and checker.on_watermark(1200.0) == []


def test_window_records_are_deterministic() -> None:
    def run() -> list:
        c = ResponseRuleChecker()
        c.process(audit("a", response="共12元", at=1000.0))
        return c.on_watermark(2000.0)

    assert [r.event_id for r in run()] == [r.event_id for r in run()]
