"""Action records for the audit trail of the retraining loop.

Every step of the loop (job claimed, data set built, trained, gated, registered, loaded, canary
stage, promoted, rolled back) becomes one ``entroloop.contract.records.Action``. Where the records go is the
caller's choice (the bus, a publisher, a list in a test): ``ActionLog`` only builds and stamps them,
so the loop's logic never depends on a transport.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

from entroloop.contract.ids import NodeStamper, new_trace_id, uuid7
from entroloop.contract.records import Action

RUNBOOK = "entroloop.training"
RUNBOOK_VERSION = "1"


class ActionLog:
    """Builds one ``Action`` per loop step and hands it to ``emit``; keeps a copy for inspection.

    ``subject`` (a trigger key or an adapter id) goes in ``alert_key`` and ``request_id`` so every
    step about one adapter can be selected with one filter in ClickHouse.
    """

    def __init__(self, emit: Callable[[Action], None] | None = None, node_id: str = "trainer") -> None:
        self._emit = emit
        self._stamper = NodeStamper(node_id)
        self._lock = threading.Lock()
        self.records: list[Action] = []

    def record(
        self,
        action: str,
        subject: str,
        outcome: str = "ok",
        trace_id: str = "",
        dry_run: bool = False,
        **detail: Any,
    ) -> Action:
        """Emit the action ``action`` (e.g. ``train.completed``) about ``subject``; return it."""
        record = Action(
            **self._stamper.stamp(),
            request_id=subject,
            trace_id=trace_id or new_trace_id(),
            action_id=uuid7(),
            action=action,
            alert_key=subject,
            runbook=RUNBOOK,
            runbook_version=RUNBOOK_VERSION,
            dry_run=dry_run,
            outcome=outcome,
            detail=json.dumps(detail, sort_keys=True, default=str),
        )
        with self._lock:
            self.records.append(record)
        if self._emit is not None:
            self._emit(record)
        return record

    def names(self, subject: str | None = None) -> list[str]:
        """The action names recorded so far (for one subject if given), in order."""
        return [r.action for r in self.records if subject is None or r.alert_key == subject]


__all__ = ["ActionLog", "RUNBOOK", "RUNBOOK_VERSION"]
