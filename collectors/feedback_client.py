"""A small client for the gateway's feedback API (``POST /v1/feedback``).

```python
from entroloop.collectors.feedback_client import FeedbackClient

client = FeedbackClient("http://node:8080", api_key="...")
answer = client.send(request_id, rating=-5, correction="Paris is the capital of France.")
answer.feedback_id  # pass it back as feedback_id= to retry the same feedback safely
```

``request_id`` is the ``X-Request-Id`` header of the completion response the feedback is about.
``rating`` is on the signed scale -10..10: below 0 is negative (thumbs -1/+1, five stars as -2..+2);
the threshold is ``ENTROLOOP_BADCASE_NEGATIVE_RATING`` (default -1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Self

import httpx


class FeedbackError(RuntimeError):
    """The gateway refused or failed the feedback: ``status`` and the gateway's ``message``."""

    def __init__(self, status: int, message: str, retry_after: float | None = None) -> None:
        super().__init__(f"feedback refused ({status}): {message}")
        self.status = status
        self.message = message
        self.retry_after = retry_after


@dataclass(frozen=True)
class FeedbackReceipt:
    """The gateway's 202 answer."""

    feedback_id: str
    event_id: str
    request_id: str


class FeedbackClient:
    """Sends feedback to one gateway with one API key (``Authorization: Bearer``)."""

    def __init__(self, base_url: str, api_key: str, timeout_s: float = 10.0,
                 transport: httpx.BaseTransport | None = None) -> None:
        self._client = httpx.Client(base_url=base_url.rstrip("/"), timeout=timeout_s, transport=transport,
                                    headers={"Authorization": f"Bearer {api_key}"})

    def send(
        self,
        request_id: str,
        rating: int,
        correction: str | None = None,
        *,
        error_type: str | None = None,
        comment: str | None = None,
        user_id: str | None = None,
        feedback_id: str | None = None,
    ) -> FeedbackReceipt:
        """Post one feedback; raises ``FeedbackError`` on any 4xx/5xx answer."""
        fields: dict[str, Any] = {"correction": correction, "error_type": error_type, "comment": comment,
                                  "user_id": user_id, "feedback_id": feedback_id}
        body = {"request_id": request_id, "rating": rating, **{k: v for k, v in fields.items() if v is not None}}
        answer = self._client.post("/v1/feedback", json=body)
        if answer.status_code >= 400:
            try:
                message = str(answer.json()["error"]["message"])
            except (ValueError, KeyError, TypeError):
                message = answer.text[:500] or answer.reason_phrase
            retry = answer.headers.get("retry-after")
            raise FeedbackError(answer.status_code, message, float(retry) if retry and retry.isdigit() else None)
        data = answer.json()
        return FeedbackReceipt(data["feedback_id"], data["event_id"], data["request_id"])

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["FeedbackClient", "FeedbackError", "FeedbackReceipt"]
