"""``POST /v1/feedback``: a user's verdict on one answer, published as a ``Feedback`` record.

The request names the answer by ``request_id`` (the ``X-Request-Id`` every completion response
carries). ``rating`` is on the contract's one signed scale, ``RATING_MIN..RATING_MAX`` (-10..10): below
0 is negative (``ENTROLOOP_BADCASE_NEGATIVE_RATING``, default -1, the threshold every stage reads). The API key is required (``auth.py``); its tenant goes into the event id and
the record's ``tenant``, and the bad-case join takes a correction only from the tenant the answer
was served to (another tenant's becomes a dead letter there, not a bad case).

* ``correction`` and ``comment`` are PII-redacted and ``user_id`` is pseudonymised with the
  gateway's redactor before anything is published, as on the audit path.
* Idempotent per ``feedback_id`` (client-chosen, else a fresh UUIDv7 returned in the answer): the
  record's ``event_id`` is ``derived_event_id`` of (tenant, feedback_id), with its time taken from
  the feedback id when that is a UUIDv7 (else the epoch), so a retried POST publishes the same event
  id, even after a restart, and the sinks keep one row.
* Rate-limited per (tenant, user) by a token bucket of ``ENTROLOOP_GATEWAY_FEEDBACK_RATE_PER_MIN``
  posts, refilled at that rate, and per tenant (all its users together) by one of
  ``ENTROLOOP_GATEWAY_FEEDBACK_TENANT_RATE_PER_MIN``: ``user_id`` is the client's to choose, so a
  tenant sending every post under a fresh one would pass the per-user bucket (and push other users'
  buckets out of the remembered ones). Over either, 429 with ``Retry-After``. The user's bucket is
  asked first, so a user's refused posts do not use up the tenant's budget.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections import OrderedDict
from typing import Any

from entroloop.collectors.gateway.completions import Publish
from pydantic import BaseModel, ConfigDict, Field, StrictInt, StrictStr, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from entroloop.contract.ids import NodeStamper, derived_event_id, uuid7
from entroloop.contract.records import RATING_MAX, RATING_MIN, Feedback
from entroloop.infra.pii import PiiRedactor

log = logging.getLogger(__name__)

FEEDBACK_PATH = "/v1/feedback"
MAX_TEXT_CHARS = 64 * 1024
MAX_ID_CHARS = 128
_BUCKETS_KEPT = 100_000  # (tenant, user) buckets remembered; the least recently used go first


class FeedbackRequest(BaseModel):
    """The JSON body of ``POST /v1/feedback`` (unknown fields are refused, types are strict)."""

    model_config = ConfigDict(extra="forbid")

    request_id: StrictStr = Field(min_length=1, max_length=MAX_ID_CHARS)
    rating: StrictInt = Field(ge=RATING_MIN, le=RATING_MAX)
    correction: StrictStr | None = Field(None, max_length=MAX_TEXT_CHARS)
    error_type: StrictStr | None = Field(None, max_length=64)
    comment: StrictStr | None = Field(None, max_length=MAX_TEXT_CHARS)
    user_id: StrictStr | None = Field(None, max_length=256)
    feedback_id: StrictStr | None = Field(None, min_length=1, max_length=MAX_ID_CHARS)


class TokenBuckets:
    """One token bucket per key: ``capacity`` tokens, refilled at ``capacity`` per minute. Thread-safe."""

    def __init__(self, per_minute: float, clock: Any = time.monotonic) -> None:
        self.capacity = float(per_minute)
        self.rate_per_s = per_minute / 60.0
        self.clock = clock
        self._buckets: OrderedDict[tuple[str, str], tuple[float, float]] = OrderedDict()
        self._lock = threading.Lock()

    def take(self, key: tuple[str, str]) -> float:
        """0 when a token was taken, else the seconds until one will be there."""
        now = self.clock()
        with self._lock:
            tokens, at = self._buckets.pop(key, (self.capacity, now))
            tokens = min(self.capacity, tokens + (now - at) * self.rate_per_s)
            wait = 0.0
            if tokens >= 1.0:
                tokens -= 1.0
            else:
                wait = (1.0 - tokens) / self.rate_per_s
            self._buckets[key] = (tokens, now)
            while len(self._buckets) > _BUCKETS_KEPT:
                self._buckets.popitem(last=False)
            return wait


def _uuid7_time(value: str) -> float | None:
    """The unix time (s) a UUIDv7 string carries, or None for anything else."""
    try:
        parsed = uuid.UUID(value)
    except ValueError:
        return None
    if parsed.version != 7:
        return None
    return (parsed.int >> 80) / 1000.0


def feedback_event_id(tenant: str, feedback_id: str) -> str:
    """The event id of a feedback: a pure function of (tenant, feedback_id)."""
    at = _uuid7_time(feedback_id) or 0.0
    return derived_event_id(f"feedback:{tenant}", feedback_id, at=at)


def _error(status: int, message: str, kind: str, headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind}}, status, headers=headers)


def _describe(exc: ValidationError) -> str:
    """One line naming each offending field (never echoing the value: it may be PII)."""
    parts = []
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "body"
        parts.append(f"{where}: {err['msg']}")
    return "invalid feedback: " + "; ".join(parts)


class FeedbackEndpoint:
    """The handler; ``published`` and ``limited`` count what it did."""

    def __init__(self, publish: Publish, redactor: PiiRedactor, stamper: NodeStamper, rate_per_min: float,
                 tenant_rate_per_min: float) -> None:
        self.publish = publish
        self.redactor = redactor
        self.stamper = stamper
        self.buckets = TokenBuckets(rate_per_min)
        self.tenant_buckets = TokenBuckets(tenant_rate_per_min)
        self.published = 0
        self.limited = 0

    def _over_limit(self, tenant: str, user: str) -> Response | None:
        """429 when the user's bucket, or then the tenant's, has no token left; else None."""
        for whom, buckets, key in (("user", self.buckets, (tenant, user)), ("tenant", self.tenant_buckets, (tenant, ""))):
            wait = buckets.take(key)
            if wait > 0:
                self.limited += 1
                retry_after = str(max(1, math.ceil(wait)))
                return _error(429, f"too many feedback posts for this {whom}; retry after {retry_after} s",
                              "rate_limit_error", {"Retry-After": retry_after})
        return None

    async def handle(self, request: Request) -> Response:
        """The route handler (a bound method: Starlette treats a callable object as a raw ASGI app)."""
        tenant = str(getattr(request.state, "tenant", "") or "")
        raw = await request.body()
        try:
            body = FeedbackRequest.model_validate_json(raw)
        except ValidationError as exc:
            if not raw.strip() or any(e["type"] == "json_invalid" for e in exc.errors()):
                return _error(400, "invalid feedback: the body must be a JSON object", "invalid_request_error")
            return _error(400, _describe(exc), "invalid_request_error")
        limited = self._over_limit(tenant, body.user_id or "")
        if limited is not None:
            return limited
        feedback_id = body.feedback_id or uuid7()
        event_id = feedback_event_id(tenant, feedback_id)
        now = time.time()
        record = Feedback(
            **{**self.stamper.stamp(now), "event_id": event_id},  # type: ignore[arg-type]
            request_id=body.request_id,
            trace_id="",
            rating=body.rating,
            user_id=self.redactor.pseudonymise_user(body.user_id or ""),
            error_type=body.error_type or "",
            corrected_answer=self.redactor.redact_text(body.correction or ""),
            comment=self.redactor.redact_text(body.comment or ""),
            tenant=tenant,
        )
        try:
            self.publish(record)
        except Exception:
            log.exception("entroloop gateway: feedback %s for request %s not published", feedback_id, body.request_id)
            return _error(503, "the feedback could not be published; retry with the same feedback_id", "gateway")
        self.published += 1
        return JSONResponse({"feedback_id": feedback_id, "event_id": event_id, "request_id": body.request_id}, 202)


__all__ = ["FEEDBACK_PATH", "FeedbackEndpoint", "FeedbackRequest", "TokenBuckets", "feedback_event_id"]
