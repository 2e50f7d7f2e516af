"""Hostile request bodies and headers: refused with a 400, or audited with their PII redacted.

Each case was found in a security review and failed before its fix (see the commit)."""

from __future__ import annotations

import httpx
from entroloop.collectors.gateway.app import GatewayConfig, create_app
from entroloop.collectors.gateway.auth import ApiKeys
from starlette.testclient import TestClient

from entroloop.contract.records import Audit
from entroloop.infra.pii import PiiRedactor

ACME_KEY = "acme-0123456789abcdef-key"
BETA_KEY = "beta-0123456789abcdef-key"
KEYS = ApiKeys.parse_text(f"acme:{ACME_KEY},beta:{BETA_KEY}", "test")
ACME = {"Authorization": f"Bearer {ACME_KEY}"}
BETA = {"Authorization": f"Bearer {BETA_KEY}"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _engine(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/v1/chat/completions":
        return httpx.Response(200, json={"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}],
                                         "usage": {"prompt_tokens": 1, "completion_tokens": 1}})
    return httpx.Response(404)


def _client(published: list, engine: str = "vllm") -> TestClient:
    config = GatewayConfig(upstream="http://engine", engine=engine, node_id="gw-r", api_keys=KEYS)
    app = create_app(config, published.append, PiiRedactor(b"k"), transport=httpx.MockTransport(_engine))
    return TestClient(app, raise_server_exceptions=False)


def _audits(published: list) -> list[Audit]:
    return [r for r in published if isinstance(r, Audit)]


def test_a_deeply_nested_prompt_is_never_answered_without_an_audit() -> None:
    """~1 KB of nesting (depth 500) parsed fine, was answered 200, and its Audit was never built
    (RecursionError in the redaction walk): any client could get unaudited completions."""
    published: list = []
    depth = 500
    body = ('{"model":"m","messages":[{"role":"user","content":' + "[" * depth + '"mail john@example.com"'
            + "]" * depth + "}]}")
    with _client(published) as client:
        answer = client.post("/v1/chat/completions", content=body,
                             headers={**ACME, "content-type": "application/json"})
    assert answer.status_code == 400 or _audits(published), (answer.status_code, published)


def test_a_lone_surrogate_in_the_prompt_gets_400_not_500() -> None:
    published: list = []
    body = b'{"model":"m","messages":[{"role":"user","content":"a \\ud800 b"}]}'
    with _client(published) as client:
        answer = client.post("/v1/chat/completions", content=body,
                             headers={**ACME, "content-type": "application/json"})
    assert answer.status_code == 400, answer.status_code


def test_pii_outside_message_values_is_redacted_before_the_audit_is_published() -> None:
    """Dict keys of messages, ``stop``, ``response_format`` and the prompt-version header went raw."""
    published: list = []
    body = {"model": "m", "messages": [{"role": "user", "content": "hi", "john.doe@example.com": "x"}],
            "stop": ["jane@example.com"], "response_format": {"type": "json_schema", "description": "bob@example.com"}}
    with _client(published) as client:
        answer = client.post("/v1/chat/completions", json=body,
                             headers={**ACME, "X-Entroloop-Prompt-Version": "alice@example.com"})
    assert answer.status_code == 200
    (audit,) = _audits(published)
    stored = f"{audit.prompt} {audit.sampling} {audit.prompt_template_version}"
    for address in ("john.doe@example.com", "jane@example.com", "bob@example.com", "alice@example.com"):
        assert address not in stored, (address, stored)
    assert audit.redactions == {"email": 4}  # every replaced entity counted, not only the messages' ones


def test_a_client_request_id_the_feedback_api_refuses_is_not_used() -> None:
    """X-Request-Id was taken at any length; /v1/feedback caps request_id at 128: no feedback possible."""
    published: list = []
    with _client(published) as client:
        answer = client.post("/v1/chat/completions", json=CHAT, headers={**ACME, "X-Request-Id": "r" * 300})
        feedback = client.post("/v1/feedback", json={"request_id": answer.headers["x-request-id"], "rating": -1},
                               headers=ACME)
    assert feedback.status_code == 202, feedback.text
