"""The action runner: alerts in, runbook steps executed, Action records out (for the audit log).

For every ``Alert`` and every runbook that matches it (``runbooks.py``):

1. idempotency: the execution (runbook, alert key, mode) is claimed in ``ActionState``; a
   redelivered or replayed alert whose execution finished is ignored (no second webhook, no second
   record). Dry runs and real runs are counted apart, so a dry run never uses up the real one;
2. rate limit: past the runbook's ``rate_limit`` the execution is not run but reported (one Action,
   outcome ``rate_limited``);
3. each step runs in order; a webhook that keeps failing after its retries gives an Action with
   outcome ``failed`` (``on_failure: stop`` reports the remaining steps as ``skipped``).

``process_batch`` takes the alerts of one poll together (``entroloop actions``): 1 and 2 for all of
them in one ``ActionState`` transaction, the rate-limited ones finished together in another (no
side effect to wait for), and the executions that act run at most ``concurrency`` at once (those of
one runbook on one target in order), each finished durably as soon as its steps are done. Handling
alerts one by one paid several fsyncs per alert, whatever the runbook decided.

Every executed, dry-run, failed, skipped or rate-limited step becomes one ``Action`` record, derived
from the alert with a deterministic id (``entroloop.streams.base.derive``): if the process dies mid-run and
the alert is handled again, the records and the ``Idempotency-Key`` of each webhook are the same,
so sinks and receivers absorb the repeat. ``open_retrain`` steps also emit a ``RetrainRequest``.

The runner is a ``Processor`` (input ``Alert``) so the embedded runner or a Faust agent can drive
it, but unlike the analytics processors it does I/O (webhooks, bundle files): give it its own
worker in a deployment so a slow gateway never holds up the analytics.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from entroloop.streams.actions.case_bundle import (
    BUNDLE_FORMAT,
    Query,
    anomalous_request_ids,
    bundle_filename,
    collect,
    sql_string,
    write_bundle,
)
from entroloop.streams.actions.runbooks import Runbook, Step, runbooks_from_settings
from entroloop.streams.actions.state import DUPLICATE, ActionState, Claim
from entroloop.streams.actions.state import RATE_LIMITED as DECIDED_RATE_LIMITED
from entroloop.streams.actions.webhook import WebhookClient
from entroloop.streams.base import Processor, derive

from entroloop.contract.codec import encode
from entroloop.contract.ids import derived_event_id
from entroloop.contract.records import Action, Alert, Event, RetrainRequest

log = logging.getLogger(__name__)

OK, DRY_RUN, FAILED, SKIPPED, RATE_LIMITED = "ok", "dry_run", "failed", "skipped", "rate_limited"


@dataclass
class StepResult:
    outcome: str
    detail: dict[str, Any]
    records: list[Event] = field(default_factory=list)


class _Fields(dict):
    """Template fields; a missing one renders as empty instead of raising mid-incident."""

    def __missing__(self, key: str) -> str:
        return ""


class ActionRunner(Processor):
    """Execute matching runbooks for each alert (see the module docstring)."""

    name = "alert_actions"
    inputs = (Alert,)

    def __init__(
        self,
        runbooks: Sequence[Runbook],
        state: ActionState,
        *,
        endpoints: dict[str, str] | None = None,
        webhook: WebhookClient | None = None,
        query: Query | None = None,
        database: str = "entroloop",
        bundle_dir: Path | None = None,
        dry_run: bool = False,
        clock: Callable[[], float] = time.time,
        outbox: bool = False,
        concurrency: int = 8,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be >= 1")
        self.runbooks = list(runbooks)
        self.state = state
        self.endpoints = {k: v.rstrip("/") for k, v in (endpoints or {}).items() if v}
        self.webhook = webhook or WebhookClient()
        self.query = query
        self.database = database
        self.bundle_dir = bundle_dir
        self.dry_run = dry_run
        self.clock = clock
        self.outbox = outbox  # keep each execution's records in ActionState until delivered (entroloop actions)
        self.counters: Counter[str] = Counter()
        self.concurrency = concurrency  # executions of one batch whose steps run at once (webhooks wait on I/O)
        self._pool: ThreadPoolExecutor | None = None
        self._query_lock = threading.Lock()  # steps run on several threads; a ClickHouse client is not shared safely

    @classmethod
    def from_settings(cls, settings: Any, query: Query | None = None, outbox: bool = False,
                      concurrency: int = 8) -> ActionRunner:
        """Runbooks, state file, endpoints and webhook policy from ``Settings`` (``ENTROLOOP_ACTIONS_*``)."""
        data_dir = Path(settings.data_dir)
        return cls(
            runbooks_from_settings(settings),
            ActionState(settings.actions_state_path or data_dir / "actions" / "state.sqlite"),
            endpoints={"gateway": settings.actions_gateway_url, "vllm": settings.actions_vllm_url},
            webhook=WebhookClient(
                timeout_s=settings.actions_webhook_timeout_s,
                attempts=settings.actions_webhook_attempts,
                backoff_s=settings.actions_webhook_backoff_s,
                token=settings.actions_webhook_token.get_secret_value(),
            ),
            query=query,
            database=settings.clickhouse_database,
            bundle_dir=settings.actions_bundle_dir or data_dir / "actions" / "bundles",
            dry_run=settings.actions_dry_run,
            outbox=outbox,
            concurrency=concurrency,
        )

    # --- Processor ----------------------------------------------------------------------------
    def process(self, record: Event) -> list[Event]:
        return self.process_batch([record])

    def process_batch(self, records: Sequence[Event]) -> list[Event]:
        """Every matching runbook of every alert in ``records``; the Action (and RetrainRequest)
        records in the order of the alerts and runbooks. See the module docstring for the batch steps."""
        planned = [(runbook, alert, self.dry_run or runbook.dry_run)
                   for alert in records if isinstance(alert, Alert)
                   for runbook in self.runbooks if runbook.matches(alert.rule, alert.severity, alert.value)]
        if not planned:
            return []
        decisions = self.state.decide([
            Claim(runbook.name, alert.alert_key, _mode(dry), runbook.version,
                  (runbook.rate_limit.max, runbook.rate_limit.per_s) if runbook.rate_limit else None)
            for runbook, alert, dry in planned
        ], self.clock())
        results: list[list[Event]] = [[] for _ in planned]
        limited: list[tuple[str, str, str, str]] = []
        limited_records: list[Event] = []
        runnable: list[int] = []
        for i, ((runbook, alert, dry), decision) in enumerate(zip(planned, decisions)):
            if decision == DUPLICATE:
                self.counters["duplicates"] += 1
            elif decision == DECIDED_RATE_LIMITED:
                self.counters[RATE_LIMITED] += 1
                log.info("actions: runbook %s rate-limited for alert %s", runbook.name, alert.alert_key)
                limit = runbook.rate_limit
                assert limit is not None
                result = StepResult(RATE_LIMITED, {"limit": f"{limit.max} per {limit.per_s:g}s"})
                results[i] = self._records(runbook, alert, len(runbook.steps), "rate_limit", dry, result)
                limited_records.extend(results[i])
                limited.append((runbook.name, alert.alert_key, _mode(dry), RATE_LIMITED))
            else:
                runnable.append(i)
        if limited:  # decisions without side effects: one transaction for all of them
            self.state.finish_many(limited, self._outbox(limited_records), self.clock())
        for i, (records_out, outcomes) in zip(runnable, self._run_all([planned[i] for i in runnable])):
            results[i] = records_out
            self.counters.update(outcomes)
        return [record for out in results for record in out]

    def _run_all(self, executions: list[tuple[Runbook, Alert, bool]]) -> list[tuple[list[Event], Counter[str]]]:
        """Run executions, at most ``concurrency`` at once; those of one runbook on one target
        (model, route, node) in their alerts' order, so two webhooks to the same target never race."""
        if len(executions) <= 1 or self.concurrency <= 1:
            return [self._execute(*execution) for execution in executions]
        groups: dict[tuple[str, ...], list[int]] = {}
        for i, (runbook, alert, _) in enumerate(executions):
            groups.setdefault((runbook.name, alert.model, alert.route, alert.subject_node), []).append(i)
        out: list[tuple[list[Event], Counter[str]] | None] = [None] * len(executions)

        def run_group(indexes: list[int]) -> None:
            for i in indexes:
                out[i] = self._execute(*executions[i])

        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix="entroloop-actions")
        for future in [self._pool.submit(run_group, indexes) for indexes in groups.values()]:
            future.result()  # an exception here is a bug in the runner itself: the batch is not committed
        return [result for result in out if result is not None]

    def close(self) -> None:
        """Stop the step threads (the state stays open: it is the caller's)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    # --- one runbook for one alert --------------------------------------------------------------
    def _execute(self, runbook: Runbook, alert: Alert, dry: bool) -> tuple[list[Event], Counter[str]]:
        """Run a claimed execution's steps, then finish it (durably, with its records in the outbox)
        before returning: an execution that acted is remembered as soon as it acted."""
        fields = self._fields(alert)
        out: list[Event] = []
        outcomes: Counter[str] = Counter()
        final = DRY_RUN if dry else OK
        stopped = False
        for index, step in enumerate(runbook.steps):
            action_id = self._action_id(runbook, alert, index)
            if stopped:
                result = StepResult(SKIPPED, {"reason": "an earlier step failed (on_failure: stop)"})
            else:
                try:
                    result = self._run_step(step, alert, fields, action_id, dry, runbook)
                except Exception as exc:  # a step's bug is reported like a failed webhook, never swallowed
                    log.exception("actions: step %s of %s crashed", step.kind, runbook.name)
                    result = StepResult(FAILED, {"error": f"{type(exc).__name__}: {exc}"})
                if result.outcome == FAILED:
                    final = FAILED
                    stopped = runbook.on_failure == "stop"
                    log.error("actions: %s step %s failed for alert %s: %s", runbook.name, step.kind, alert.alert_key, result.detail)
            outcomes[result.outcome] += 1
            out.extend(self._records(runbook, alert, index, step.kind, dry, result))
        self.state.finish(runbook.name, alert.alert_key, _mode(dry), final, self.clock(), self._outbox(out))
        return out, outcomes

    # --- steps --------------------------------------------------------------------------------
    def _run_step(self, step: Step, alert: Alert, fields: _Fields, action_id: str, dry: bool, runbook: Runbook) -> StepResult:
        if step.endpoint is not None:
            return self._webhook_step(step, alert, fields, action_id, dry)
        if step.kind == "capture_bundle":
            return self._capture_bundle(step, alert, dry, runbook)
        if step.kind == "open_retrain":
            return self._open_retrain(step, alert, fields, dry, runbook)
        raise ValueError(f"unknown step kind {step.kind}")  # pragma: no cover - the schema forbids it

    def _webhook_step(self, step: Step, alert: Alert, fields: _Fields, action_id: str, dry: bool) -> StepResult:
        payload: dict[str, Any]
        if step.kind in ("unload_adapter", "rollback_adapter"):
            lora_name = step.lora_name.format_map(fields)
            if not lora_name:
                return StepResult(SKIPPED, {"reason": "the alerted request was served by the base model: no adapter to "
                                                      + step.kind.removesuffix("_adapter")})
            fields = _Fields({**fields, "adapter": lora_name})  # the path names the adapter the step acts on
            payload = {"lora_name": lora_name}  # all vLLM's /v1/unload_lora_adapter takes
            if step.endpoint == "gateway":
                payload.update(model=alert.model, alert_key=alert.alert_key, reason=step.reason.format_map(fields))
        elif step.kind == "switch_fallback":
            payload = {"route": alert.route, "model": alert.model, "tier": step.tier, "alert_key": alert.alert_key,
                       "reason": step.reason.format_map(fields), "duration_s": step.duration_s}
        else:
            target = {"node": alert.subject_node} if step.kind == "pause_node" else {"route": alert.route}
            payload = {**target, "model": alert.model, "alert_key": alert.alert_key,
                       "reason": step.reason.format_map(fields), "duration_s": step.duration_s}
        path = step.url_path.format_map(fields)
        base = self.endpoints.get(step.endpoint or "")
        detail: dict[str, Any] = {"endpoint": step.endpoint, "path": path, "payload": payload}
        if dry:
            detail["url"] = f"{base}{path}" if base else f"<{step.endpoint}>{path}"
            return StepResult(DRY_RUN, detail)
        if not base:
            detail["error"] = f"no {step.endpoint} URL configured (ENTROLOOP_ACTIONS_{(step.endpoint or '').upper()}_URL)"
            return StepResult(FAILED, detail)
        detail["url"] = f"{base}{path}"
        response = self.webhook.post(detail["url"], payload, idempotency_key=action_id)
        detail.update(response.as_detail())
        return StepResult(OK if response.ok else FAILED, detail)

    def _capture_bundle(self, step: Step, alert: Alert, dry: bool, runbook: Runbook) -> StepResult:
        if self.query is None:
            return StepResult(FAILED, {"error": "no ClickHouse query function configured for case bundles"})
        ids = anomalous_request_ids(self._query, self.database, alert, step.scope, step.last_n)
        detail: dict[str, Any] = {"requests": len(ids), "scope": list(step.scope), "last_n": step.last_n}
        if dry:
            return StepResult(DRY_RUN, detail)
        if self.bundle_dir is None:
            return StepResult(FAILED, {**detail, "error": "no bundle folder configured"})
        tables = collect(self._query, self.database, ids)
        content = {
            "format": BUNDLE_FORMAT,
            "alert": json.loads(_encode_json(alert)),
            "runbook": {"name": runbook.name, "version": runbook.version},
            "captured_at": self.clock(),
            "request_ids": ids,
            **tables,
        }
        path, digest = write_bundle(self.bundle_dir, bundle_filename(runbook.name, alert.alert_key), content)
        detail.update({"path": str(path), "sha256": digest, **{f"{t}_rows": len(rows) for t, rows in tables.items()}})
        return StepResult(OK, detail)

    def _open_retrain(self, step: Step, alert: Alert, fields: _Fields, dry: bool, runbook: Runbook) -> StepResult:
        trigger_key = f"alert:{runbook.name}:{alert.alert_key}"
        request = derive(
            alert, RetrainRequest, 0, f"actions.{runbook.name}.retrain",
            trigger_key=trigger_key,
            model=alert.model,
            category=step.category.format_map(fields) or alert.rule,
            reason=step.reason.format_map(fields),
            adapter=fields["adapter"],
            window_start=alert.emitted_at,
            window_end=alert.emitted_at,
        )
        detail = {"trigger_key": trigger_key, "category": request.category, "adapter": request.adapter}
        if dry:
            return StepResult(DRY_RUN, detail)
        return StepResult(OK, {**detail, "retrain_event_id": request.event_id}, [request])

    # --- helpers --------------------------------------------------------------------------------
    def _query(self, sql: str) -> list[dict[str, Any]]:
        """``query`` for one step at a time (steps of a batch run on several threads)."""
        assert self.query is not None
        with self._query_lock:
            return self.query(sql)

    def _outbox(self, records: list[Event]) -> list[bytes]:
        return [encode(record) for record in records] if self.outbox else []

    def _fields(self, alert: Alert) -> _Fields:
        fields = _Fields({name: getattr(alert, name) for name in
                          ("rule", "model", "route", "subject_node", "alert_key", "severity", "request_id", "value", "threshold")})
        fields["adapter"] = self._adapter_of(alert)
        return fields

    def _adapter_of(self, alert: Alert) -> str:
        """The adapter that served the alerted request ('' for the base model or when unknown)."""
        if self.query is None or not alert.request_id:
            return ""
        try:
            rows = self._query(
                f"SELECT adapter FROM {self.database}.token_entropy WHERE request_id = {sql_string(alert.request_id)} "
                "AND adapter != '' LIMIT 1"
            )
        except Exception:  # noqa: BLE001 - an unknown adapter only makes unload steps skip
            log.warning("actions: adapter lookup failed for %s", alert.request_id, exc_info=True)
            return ""
        return str(rows[0]["adapter"]) if rows else ""

    def _action_id(self, runbook: Runbook, alert: Alert, index: int) -> str:
        return derived_event_id(alert.event_id, f"actions.{runbook.name}", index, at=alert.emitted_at)

    def _records(self, runbook: Runbook, alert: Alert, index: int, action: str, dry: bool, result: StepResult) -> list[Event]:
        detail = {**result.detail, "executed_at": round(self.clock(), 3)}
        record = derive(
            alert, Action, index, f"actions.{runbook.name}",
            action_id=self._action_id(runbook, alert, index),
            action=action,
            alert_key=alert.alert_key,
            runbook=runbook.name,
            runbook_version=runbook.version,
            dry_run=dry,
            outcome=result.outcome,
            detail=json.dumps(detail, sort_keys=True, default=str)[:8000],
        )
        return [record, *result.records]


def _mode(dry: bool) -> str:
    """Dry runs and real runs are remembered apart: a dry run never uses up the real one."""
    return "dry_run" if dry else "live"


def _encode_json(record: Event) -> str:
    import msgspec

    return msgspec.json.encode(record).decode()


__all__ = ["ActionRunner", "StepResult", "OK", "DRY_RUN", "FAILED", "SKIPPED", "RATE_LIMITED"]
