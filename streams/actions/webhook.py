"""POST JSON to a webhook with retries and exponential backoff; report the outcome, never raise.

Transient failures (connection refused or reset, timeouts, HTTP 5xx, 429) are retried after
``backoff_s * 2**(attempt-1)`` seconds, capped at ``max_backoff_s``; other HTTP errors (4xx) are
the request's fault and are not retried. After the last attempt the caller gets a
``WebhookResult`` with ``ok=False``, the attempts and the last error, so it can report the failure
(an Action record with outcome ``failed``) instead of dropping it.

Every request carries ``Idempotency-Key`` (the action id), so a receiver can ignore a retry of a
request it already applied, and, if configured, ``Authorization: Bearer <token>``.
Standard library only (``urllib``): one POST per action does not need a client library.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

RETRYABLE_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})


@dataclass
class WebhookResult:
    ok: bool
    status: int | None
    attempts: int
    error: str = ""
    body: str = ""
    backoffs_s: list[float] = field(default_factory=list)

    def as_detail(self) -> dict[str, Any]:
        return {"status": self.status, "attempts": self.attempts, "error": self.error, "backoffs_s": self.backoffs_s,
                "response": self.body[:500]}


class WebhookClient:
    """Blocking JSON POSTs with bounded retries (see the module docstring)."""

    def __init__(
        self,
        timeout_s: float = 5.0,
        attempts: int = 4,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        token: str = "",
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if attempts < 1:
            raise ValueError("attempts must be >= 1")
        self.timeout_s = timeout_s
        self.attempts = attempts
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._token = token
        self._sleep = sleep

    def backoff(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        return min(self.backoff_s * 2 ** (attempt - 1), self.max_backoff_s)

    def post(self, url: str, payload: dict[str, Any], idempotency_key: str = "") -> WebhookResult:
        headers = {"Content-Type": "application/json", "User-Agent": "entroloop-actions/1"}
        if idempotency_key:
            headers["Idempotency-Key"] = idempotency_key
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        data = json.dumps(payload, sort_keys=True).encode()
        result = WebhookResult(ok=False, status=None, attempts=0)
        for attempt in range(1, self.attempts + 1):
            result.attempts = attempt
            retryable = True
            try:
                request = urllib.request.Request(url, data=data, headers=headers, method="POST")
                with urllib.request.urlopen(request, timeout=self.timeout_s) as response:  # noqa: S310 - configured URL
                    result.status = response.status
                    result.body = response.read(4096).decode(errors="replace")
                    result.ok, result.error = True, ""
                    return result
            except urllib.error.HTTPError as exc:
                result.status = exc.code
                result.body = exc.read(4096).decode(errors="replace") if exc.fp else ""
                result.error = f"HTTP {exc.code} {exc.reason}"
                retryable = exc.code in RETRYABLE_STATUS
            except (urllib.error.URLError, OSError, TimeoutError) as exc:
                reason = getattr(exc, "reason", exc)
                result.status = None
                result.error = f"{type(exc).__name__}: {reason}"
            if not retryable or attempt == self.attempts:
                break
            wait = self.backoff(attempt)
            result.backoffs_s.append(wait)
            self._sleep(wait)
        return result


__all__ = ["WebhookClient", "WebhookResult", "RETRYABLE_STATUS"]
