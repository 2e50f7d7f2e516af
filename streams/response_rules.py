"""The rule library on every audited response, not only corrected ones (the consistency layer).

Counting violations per rule, model and route per period shows a rise (say, amounts written
``12元`` after an adapter promotion) before users complain. Counts are event-time tumbling
windows closed by the watermark and emitted as ``Health`` gauges; responses that break an
``alert_rules`` rule (compliance by default: one such answer is already an incident) also raise
an ``Alert`` each.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec
from entroloop.streams.base import Processor, derive
from entroloop.streams.rules import COMPLIANCE, ResponseRules
from entroloop.streams.windowing import synthesize, window_start

from entroloop.contract.records import Alert, Audit, Event, Health
from entroloop.contract.settings import Settings


class ResponseRulesSnapshot(msgspec.Struct, array_like=True):
    """``ResponseRuleChecker``'s state: the open periods' counts."""

    counts: list[tuple[float, str, str, dict[str, int]]]  # window start, model, route, {rule: responses}
    closed_until: float
    late_events: int


_SNAPSHOT_DECODER = msgspec.msgpack.Decoder(ResponseRulesSnapshot)


class ResponseRuleChecker(Processor):
    """Run ``ResponseRules.check_response`` on each ``Audit`` and count violations.

    Output on ``process``: an ``Alert`` (rule ``response_<rule>``) per violating response for rules
    in ``alert_rules``. Output on ``on_watermark``: per closed period and (model, route), a
    ``Health`` record ``metric="responses_checked"`` and one ``metric="rule_violations"`` per rule
    with violations; labels carry rule, model, route, window_start, window_end.
    """

    name = "response_rules"
    inputs = (Audit,)
    needs_every_partition = True  # counts over many requests: one worker must see every one

    def __init__(
        self,
        rules: ResponseRules | None = None,
        period_s: float = 60.0,
        grace_s: float = 5.0,
        alert_rules: Iterable[str] = (COMPLIANCE,),
    ) -> None:
        self.rules = rules or ResponseRules()
        self.period_s = period_s
        self.grace_s = grace_s
        self.alert_rules = frozenset(alert_rules)
        # (window_start, model, route) -> {"": responses checked, rule: violating responses}
        self.counts: dict[tuple[float, str, str], dict[str, int]] = {}
        self.closed_until = float("-inf")
        self.late_events = 0

    @classmethod
    def from_settings(cls, settings: Settings) -> ResponseRuleChecker:
        return cls(
            rules=ResponseRules.from_settings(settings),
            period_s=settings.rule_count_period_s,
            grace_s=settings.window_grace_s,
        )

    def snapshot(self) -> bytes:
        return msgspec.msgpack.encode(ResponseRulesSnapshot(
            counts=[(*key, bucket) for key, bucket in self.counts.items()],
            closed_until=self.closed_until,
            late_events=self.late_events,
        ))

    def restore(self, snapshot: bytes) -> None:
        state = _SNAPSHOT_DECODER.decode(snapshot)
        self.counts = {(start, model, route): bucket for start, model, route, bucket in state.counts}
        self.closed_until = state.closed_until
        self.late_events = state.late_events

    def process(self, record: Event) -> list[Event]:
        if not isinstance(record, Audit):
            return []
        violations = self.rules.check_response(record.response, record.route)
        start = window_start(record.emitted_at, self.period_s)
        if start + self.period_s <= self.closed_until:
            self.late_events += 1  # its window is already reported; counting it would rewrite history
        else:
            bucket = self.counts.setdefault((start, record.model, record.route), {"": 0})
            bucket[""] += 1
            for rule in {v.rule for v in violations}:
                bucket[rule] = bucket.get(rule, 0) + 1
        out: list[Event] = []
        alerted: set[str] = set()
        for v in violations:
            if v.rule not in self.alert_rules or v.rule in alerted:
                continue
            alerted.add(v.rule)
            out.append(
                derive(
                    record,
                    Alert,
                    len(out),
                    self.name,
                    alert_key=f"response_{v.rule}:{record.request_id}",
                    rule=f"response_{v.rule}",
                    severity="warning",
                    model=record.model,
                    route=record.route,
                    subject_node=record.node_id,
                    value=float(sum(1 for x in violations if x.rule == v.rule)),
                    detail="; ".join(x.detail for x in violations if x.rule == v.rule)[:500],
                    source_event_id=record.event_id,
                )
            )
        return out

    def on_watermark(self, event_time: float) -> list[Event]:
        """Emit and forget every period that ended at least ``grace_s`` before ``event_time``."""
        horizon = event_time - self.grace_s
        out: list[Event] = []
        for key in sorted(k for k in self.counts if k[0] + self.period_s <= horizon):
            start, model, route = key
            bucket = self.counts.pop(key)
            end = start + self.period_s
            base_labels = {
                "model": model,
                "route": route,
                "window_start": f"{start:.0f}",
                "window_end": f"{end:.0f}",
            }
            series = f"{self.name}/{model}/{route}"
            out.append(
                synthesize(
                    Health,
                    self.name,
                    series,
                    end,
                    0,
                    component=self.name,
                    metric="responses_checked",
                    value=float(bucket[""]),
                    labels=base_labels,
                )
            )
            for i, rule in enumerate(sorted(r for r in bucket if r), start=1):
                out.append(
                    synthesize(
                        Health,
                        self.name,
                        series,
                        end,
                        i,
                        component=self.name,
                        metric="rule_violations",
                        value=float(bucket[rule]),
                        labels={**base_labels, "rule": rule},
                    )
                )
        self.closed_until = max(self.closed_until, horizon)
        return out


__all__ = ["ResponseRuleChecker"]
