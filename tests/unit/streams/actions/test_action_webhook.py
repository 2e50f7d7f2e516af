"""Webhook retries against a real local HTTP server: backoff doubles, 4xx is final, failure is reported."""

from __future__ import annotations

import socket
import time

from entroloop.streams.actions.webhook import WebhookClient


def test_success_posts_json_with_idempotency_key_and_token(receiver):
    result = WebhookClient(token="s3cret").post(f"{receiver.url}/hook", {"a": 1}, idempotency_key="k-1")
    assert result.ok and result.status == 200 and result.attempts == 1
    (req,) = receiver.requests
    assert req.body == {"a": 1}
    assert req.headers["Idempotency-Key"] == "k-1"
    assert req.headers["Authorization"] == "Bearer s3cret"


def test_transient_failures_are_retried_with_doubling_backoff(receiver):
    receiver.scripts["/hook"] = [503, 502]
    waits: list[float] = []
    result = WebhookClient(attempts=4, backoff_s=0.1, sleep=waits.append).post(f"{receiver.url}/hook", {}, "k")
    assert result.ok and result.attempts == 3
    assert waits == [0.1, 0.2]
    assert len(receiver.requests) == 3
    assert {r.headers["Idempotency-Key"] for r in receiver.requests} == {"k"}


def test_persistent_failure_is_reported_after_all_attempts_with_real_waits(receiver):
    receiver.always["/hook"] = 500
    started = time.monotonic()
    result = WebhookClient(attempts=3, backoff_s=0.05).post(f"{receiver.url}/hook", {}, "k")
    elapsed = time.monotonic() - started
    assert not result.ok and result.status == 500 and result.attempts == 3
    assert result.error.startswith("HTTP 500")
    assert result.backoffs_s == [0.05, 0.1]
    assert elapsed >= 0.15
    assert len(receiver.requests) == 3


def test_client_errors_are_not_retried(receiver):
    receiver.always["/hook"] = 404
    waits: list[float] = []
    result = WebhookClient(attempts=4, sleep=waits.append).post(f"{receiver.url}/hook", {}, "k")
    assert not result.ok and result.status == 404 and result.attempts == 1 and waits == []


def test_unreachable_receiver_is_retried_then_reported():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again below: nothing listens there
    waits: list[float] = []
    result = WebhookClient(attempts=3, backoff_s=1.0, max_backoff_s=1.5, sleep=waits.append).post(
        f"http://127.0.0.1:{port}/hook", {}, "k"
    )
    assert not result.ok and result.status is None and result.attempts == 3
    assert "Connection refused" in result.error or "URLError" in result.error
    assert waits == [1.0, 1.5]  # capped
