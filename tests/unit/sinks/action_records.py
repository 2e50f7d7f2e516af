"""Seeded Action records for the audit-log tests (alert runbook steps and retraining-loop steps)."""

from __future__ import annotations

import json

from entroloop.contract.ids import derived_event_id
from entroloop.contract.records import Action

AT = 1_790_000_000.0  # 2026-09-21
KINDS = ("capture_bundle", "pause_node", "open_retrain", "train.completed")


def sample_actions(n: int, alerts: int = 6, span_s: float = 2 * 86_400) -> list[Action]:
    """``n`` actions about ``alerts`` alert keys, several kinds, over two days."""
    out = []
    for i in range(n):
        alert_key = f"gibberish:req-{i % alerts}"
        at = AT + span_s * i / n
        out.append(Action(
            event_id=derived_event_id(alert_key, "action", str(i), at=at), emitted_at=at, node_id="alert_actions",
            seq=i, request_id=f"req-{i % alerts}", trace_id=f"{i:032x}", action_id=f"act-{i:04d}",
            action=KINDS[i % len(KINDS)], alert_key=alert_key, runbook="pause-node-on-gibberish", runbook_version="1",
            dry_run=i % 5 == 0, outcome="ok", detail=json.dumps({"step": i}),
        ))
    return out
