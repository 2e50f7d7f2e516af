"""Distributed training data: bad cases from ClickHouse, accepted answers from the WORM audit log.

The compliance rule (``entroloop/infra/worm/reader.py``): audit records are read back by audit id or user id
only, never searched by content. So the replay sample is chosen where only metadata lives and read
where the text lives:

1. **Which requests** - ClickHouse ``audit_index`` (metadata, no text): audited answers of the
   request's model up to its window end, with a non-empty response, and *accepted*: no feedback at or
   below the negative rating from the answer's own tenant (``verdict_applies``: equal tenants, or an
   empty one on either side), not a bad case (by request id or audit id), no fallback. The sample is
   ``ORDER BY sipHash64(trigger key, audit_id) LIMIT n``: a keyed hash, so the same job over the same
   tables picks the same ids, and different jobs pick different samples.
2. **Their text** - each sampled id is read from the audit log with
   ``find_records_for_keys(store, "audit_id", ids)``: only files named by the hash-chained manifests, text
   already PII-redacted by the gateway before the record existed.
3. **Bad cases** - ClickHouse ``bad_cases`` keeps their (already redacted) prompt, response and
   correction: it is the regression suite's own table (migration 0001), read directly.

``n`` is ``replay_ratio`` x the bad cases with a correction x ``oversample`` (the data set builder
then drops duplicates by normalized prompt and prompts that were corrected, and keeps
``replay_ratio`` x corrections), capped by ``max_replay``.

Cost: one pass over the log for the whole sample (manifests listed once, each file read once with an
``in`` filter on ``audit_id``), so it grows with the files, not with ids x files; object storage
latency dominates. Figures: training/README.md.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from typing import Any

from entroloop.contract.records import (
    NEGATIVE_RATING,
    Audit,
    BadCase,
    Event,
    RetrainRequest,
)

AUDIT_FIELDS = tuple(f for f in Audit.__struct_fields__)
BAD_CASE_COLUMNS = ("event_id", "emitted_at", "node_id", "seq", "request_id", "trace_id", "model", "route",
                    "adapter", "audit_id", "prompt", "response", "correction", "confidence")


def audit_from_row(row: dict[str, Any]) -> Audit:
    """An audit log row (``find_records``) back into an ``Audit`` record."""
    values = {name: row[name] for name in AUDIT_FIELDS if name in row}
    for name in ("sampling", "redactions"):  # stored as sorted-key JSON
        if isinstance(values.get(name), str):
            values[name] = json.loads(values[name] or "{}")
    return Audit(**values)


class WarehouseSource:
    """Training records of one request from ClickHouse (ids, bad cases) and the audit log (text).

    ``client`` is a clickhouse-connect client (server or chDB), ``store`` the audit log's
    ``WormStore``. Implements ``records_for(request)``; see the module docstring.
    """

    def __init__(self, client: Any, database: str, store: Any, *, replay_ratio: float = 1.0,
                 negative_rating: int = NEGATIVE_RATING, oversample: float = 2.0, max_replay: int = 2000) -> None:
        self.client = client
        self.database = database
        self.store = store
        self.replay_ratio = replay_ratio
        self.negative_rating = negative_rating
        self.oversample = oversample
        self.max_replay = max_replay
        self.last_stats: dict[str, int] = {}

    def records_for(self, request: RetrainRequest) -> list[Event]:
        bad = self.bad_cases(request)
        with_correction = sum(1 for b in bad if b.correction.strip())
        limit = min(self.max_replay, math.ceil(self.replay_ratio * with_correction * self.oversample))
        ids = self.accepted_audit_ids(request, limit) if limit else []
        audits = list(self.read_audits(ids))
        self.last_stats = {"bad_cases": len(bad), "replay_ids": len(ids), "replay_read": len(audits)}
        return [*bad, *audits]

    # --- ClickHouse ------------------------------------------------------------------------------
    def _window(self, request: RetrainRequest) -> tuple[str, dict[str, Any]]:
        params: dict[str, Any] = {"model": request.model}
        if request.window_end:
            params["until"] = request.window_end
            return "AND emitted_at <= toDateTime64(%(until)s, 3)", params
        return "", params

    def bad_cases(self, request: RetrainRequest) -> list[BadCase]:
        until, params = self._window(request)
        rows = self.client.query(
            f"SELECT {', '.join(BAD_CASE_COLUMNS)} FROM {self.database}.bad_cases FINAL "
            f"WHERE model = %(model)s {until} ORDER BY emitted_at, event_id",
            parameters=params,
        ).result_rows
        out = []
        for row in rows:
            values = dict(zip(BAD_CASE_COLUMNS, row))
            values["event_id"] = str(values["event_id"])
            values["emitted_at"] = values["emitted_at"].timestamp()
            out.append(BadCase(**values))
        return out

    def accepted_audit_ids(self, request: RetrainRequest, limit: int) -> list[str]:
        """Audit ids of accepted answers of ``request.model``, a keyed-hash sample of ``limit``."""
        until, params = self._window(request)
        db = self.database
        params.update({"neg": self.negative_rating, "seed": request.trigger_key, "limit": int(limit)})
        rows = self.client.query(
            f"SELECT audit_id FROM {db}.audit_index FINAL "
            f"WHERE model = %(model)s AND audit_id != '' AND response_chars > 0 {until} "
            # verdict_applies in SQL: a negative verdict of the answer's tenant, or one without a tenant,
            # or any negative verdict on an answer served without a tenant
            f"AND (request_id, tenant) NOT IN (SELECT request_id, tenant FROM {db}.feedback FINAL "
            f"WHERE rating <= %(neg)s) "
            f"AND request_id NOT IN (SELECT request_id FROM {db}.feedback FINAL "
            f"WHERE rating <= %(neg)s AND tenant = '') "
            f"AND (tenant != '' OR request_id NOT IN (SELECT request_id FROM {db}.feedback FINAL "
            f"WHERE rating <= %(neg)s)) "
            f"AND request_id NOT IN (SELECT request_id FROM {db}.bad_cases FINAL) "
            f"AND audit_id NOT IN (SELECT audit_id FROM {db}.bad_cases FINAL WHERE audit_id != '') "
            f"AND request_id NOT IN (SELECT request_id FROM {db}.fallbacks FINAL) "
            f"GROUP BY audit_id ORDER BY sipHash64(%(seed)s, audit_id), audit_id LIMIT %(limit)s",
            parameters=params,
        ).result_rows
        return [str(r[0]) for r in rows]

    # --- the audit log ---------------------------------------------------------------------------
    def read_audits(self, audit_ids: list[str]) -> Iterator[Audit]:
        """The audit records of ``audit_ids``, in that order (the first copy of each: a redelivery
        can store a record twice); ids missing from the log are skipped.

        One pass over the log for the whole sample (``find_records_for_keys``: manifests listed once,
        each file read once), still by audit id only.
        """
        from entroloop.infra.worm.reader import find_records_for_keys

        found: dict[str, Audit] = {}
        for row in find_records_for_keys(self.store, "audit_id", audit_ids):
            found.setdefault(row["audit_id"], audit_from_row(row))
        yield from (found[i] for i in audit_ids if i in found)


__all__ = ["AUDIT_FIELDS", "WarehouseSource", "audit_from_row"]
