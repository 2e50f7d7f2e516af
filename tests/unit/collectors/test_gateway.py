"""The audit gateway against a fake OpenAI-compatible engine on 127.0.0.1."""

from __future__ import annotations

import json
import math

import httpx
import numpy as np
import pytest
from entroloop.collectors.gateway.app import GatewayConfig, create_app
from entroloop.collectors.gateway.topk_entropy import entropy_from_logprobs, token_hash
from starlette.testclient import TestClient

from entroloop.contract import codec
from entroloop.contract.records import Audit, Span, TokenEntropy
from entroloop.infra.pii import PiiRedactor
from tests.unit.collectors.fake_openai_upstream import FakeUpstream

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
CLIENT_PARENT = "00f067aa0ba902b7"
EMAIL = "alice.smith@example.com"
PHONE = "13812345678"
RAW_USER = "alice-account-7"
KEY = b"test-key"
# The fake engine's top logprobs: (0.5, 0.25, 0.25) and (0.4, 0.4, 0.1, 0.1), both summing to 1.
EXPECTED_ENTROPIES = [1.5 * math.log(2), -(0.8 * math.log(0.4) + 0.2 * math.log(0.1))]
# ... and its sampled tokens, "Hello" and " there": one hash each, aligned with the entropies.
EXPECTED_HASHES = [token_hash("Hello"), token_hash(" there")]
# ... and their surprisals under the same renormalised top-k: -ln 0.5 and -ln 0.4 (the top-k mass is 1)
EXPECTED_SURPRISALS = [math.log(2), math.log(2.5)]

CHAT = {
    "model": "base-m",
    "messages": [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": f"Mail {EMAIL} or call {PHONE} about my order"},
    ],
    "temperature": 0.7,
    "max_tokens": 16,
    "user": RAW_USER,
}
HEADERS = {
    "traceparent": f"00-{TRACE_ID}-{CLIENT_PARENT}-01",
    "X-Entroloop-Prompt-Version": "support-v3",
    "X-Entroloop-Tenant": "acme",
    "X-Request-Id": "req-gw-1",
}


def _gateway(upstream: FakeUpstream, published: list, engine: str = "auto") -> TestClient:
    config = GatewayConfig(upstream=upstream.url, engine=engine, node_id="gw-1", route="support",
                           tokenizer_digest="sha256:abc")
    return TestClient(create_app(config, published.append, PiiRedactor(KEY)))


def _by_type(published: list) -> dict[type, list]:
    out: dict[type, list] = {}
    for record in published:
        out.setdefault(type(record), []).append(record)
    return out


def test_topk_entropy_hand_computed() -> None:
    # p = (0.5, 0.25, 0.25): H = 0.5 ln 2 + 2 * 0.25 ln 4 = 1.5 ln 2
    assert entropy_from_logprobs([math.log(0.5), math.log(0.25), math.log(0.25)]) == pytest.approx(1.5 * math.log(2))
    # (0.4, 0.4) renormalised to (0.5, 0.5): ln 2; -inf entries are ignored
    assert entropy_from_logprobs([math.log(0.4), math.log(0.4), -math.inf]) == pytest.approx(math.log(2))
    assert entropy_from_logprobs([0.0]) == 0.0
    assert math.isnan(entropy_from_logprobs([]))


def test_openai_engine_chat_audit_span_and_approximate_entropy() -> None:
    published: list = []
    with FakeUpstream(vllm=False) as upstream, _gateway(upstream, published) as client:
        answer = client.post("/v1/chat/completions", json=CHAT, headers=HEADERS)
        direct = httpx.post(f"{upstream.url}/v1/chat/completions", json=CHAT)
        _, sent_body, sent_headers = upstream.received[0]

    assert answer.status_code == 200
    # The client gets what the engine would have sent it: no logprobs it did not ask for.
    assert answer.json() == direct.json()
    assert answer.json()["choices"][0]["logprobs"] is None
    # ... while the engine was asked for top-20 logprobs, and joined the client's trace.
    assert sent_body["logprobs"] is True and sent_body["top_logprobs"] == 20
    assert "vllm_xargs" not in sent_body

    records = _by_type(published)
    (audit,) = records[Audit]
    (span,) = records[Span]
    (tokens,) = records[TokenEntropy]

    # Audit fields
    assert audit.request_id == "req-gw-1"
    assert (audit.model, audit.adapter, audit.route, audit.tenant) == ("base-m", "", "support", "acme")
    assert audit.prompt_template_version == "support-v3"
    assert audit.sampling == {"temperature": 0.7, "max_tokens": 16}
    assert audit.tokenizer_digest == "sha256:abc"
    assert audit.engine_version == ""  # not vLLM and none configured
    assert audit.node_id == "gw-1"
    # PII redacted before the record was built, in the prompt and in the echoed response
    assert audit.redactions == {"email": 2, "phone": 2}
    redactor = PiiRedactor(KEY)
    assert f"[EMAIL:{redactor.pseudonym('email', EMAIL)}]" in audit.prompt
    assert f"[PHONE:{redactor.pseudonym('phone', PHONE)}]" in audit.response
    assert "about my order" in audit.response and "You are helpful." in audit.prompt
    # user id pseudonymous and stable (same key -> same pseudonym)
    assert audit.user_id == redactor.pseudonymise_user(RAW_USER) and len(audit.user_id) == 16
    for record in published:
        data = codec.encode(record)
        for raw in (EMAIL.encode(), PHONE.encode(), RAW_USER.encode()):
            assert raw not in data, (type(record).__name__, raw)

    # one trace across Audit, Span, TokenEntropy and the upstream hop
    assert audit.trace_id == span.trace_id == tokens.trace_id == TRACE_ID
    assert audit.request_id == span.request_id == tokens.request_id
    assert span.parent_span_id == CLIENT_PARENT
    assert sent_headers["traceparent"] == f"00-{TRACE_ID}-{span.span_id}-01"
    assert sent_headers["x-request-id"] == "req-gw-1"
    assert (span.status, span.model, span.prompt_tokens, span.output_tokens) == ("ok", "base-m", 9, 2)
    assert span.e2e_s is not None and 0 <= span.e2e_s < 10
    assert span.attributes["http.status_code"] == 200

    # approximate entropy from top-k, per generated token
    assert tokens.approximate is True
    np.testing.assert_allclose(tokens.values(), EXPECTED_ENTROPIES, atol=1e-3)
    assert tokens.hashes().tolist() == EXPECTED_HASHES
    np.testing.assert_allclose(tokens.surprisal_values(), EXPECTED_SURPRISALS, atol=1e-3)


def test_client_logprobs_are_trimmed_to_what_it_asked() -> None:
    published: list = []
    body = {**CHAT, "logprobs": True, "top_logprobs": 1}
    with FakeUpstream() as upstream, _gateway(upstream, published, engine="openai") as client:
        answer = client.post("/v1/chat/completions", json=body)
        direct = httpx.post(f"{upstream.url}/v1/chat/completions", json=body)
    assert answer.json() == direct.json()
    assert len(answer.json()["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 1
    (tokens,) = _by_type(published)[TokenEntropy]
    np.testing.assert_allclose(tokens.values(), EXPECTED_ENTROPIES, atol=1e-3)


def test_completions_endpoint_with_openai_engine() -> None:
    published: list = []
    body = {"model": "base-m", "prompt": f"Reach me at {EMAIL}", "max_tokens": 2}
    with FakeUpstream() as upstream, _gateway(upstream, published) as client:
        answer = client.post("/v1/completions", json=body, headers={"X-User-Id": "bob"})
        direct = httpx.post(f"{upstream.url}/v1/completions", json=body)
        assert upstream.received[0][1]["logprobs"] == 20
        generated_request_id = upstream.received[0][2]["x-request-id"]
    assert answer.json() == direct.json()
    records = _by_type(published)
    (audit,) = records[Audit]
    assert audit.redactions == {"email": 2}
    assert EMAIL not in audit.prompt and EMAIL not in audit.response
    assert audit.user_id == PiiRedactor(KEY).pseudonymise_user("bob")
    assert len(audit.trace_id) == 32 and audit.trace_id == records[Span][0].trace_id == records[TokenEntropy][0].trace_id
    assert records[Span][0].parent_span_id == ""  # no traceparent: the gateway started the trace
    assert audit.request_id == generated_request_id and len(generated_request_id) == 36  # a UUIDv7
    np.testing.assert_allclose(records[TokenEntropy][0].values(), EXPECTED_ENTROPIES, atol=1e-3)
    assert records[TokenEntropy][0].hashes().tolist() == EXPECTED_HASHES


def test_vllm_engine_gets_correlation_ids_adapter_and_version_and_answer_is_byte_identical() -> None:
    published: list = []
    # a client's own tap keys (an opt-out of measurement, a spoofed id) do not reach the engine
    body = {**CHAT, "model": "support-lora",
            "vllm_xargs": {"mine": 1, "entroloop_tap": False, "entroloop_request_id": "spoofed"}}
    with FakeUpstream(vllm=True) as upstream, _gateway(upstream, published) as client:
        answer = client.post("/v1/chat/completions", json=body, headers=HEADERS)
        _, sent_body, sent_headers = upstream.received[0]
        direct = httpx.post(f"{upstream.url}/v1/chat/completions", json=sent_body)
    assert answer.content == direct.content
    assert sent_body["vllm_xargs"] == {"mine": 1, "entroloop_request_id": "req-gw-1", "entroloop_trace_id": TRACE_ID,
                                       "entroloop_route": "support"}
    assert "logprobs" not in sent_body  # the tap computes the exact entropy in the engine
    records = _by_type(published)
    assert TokenEntropy not in records  # those come from the tap, under the same ids
    (audit,) = records[Audit]
    (span,) = records[Span]
    assert (audit.model, audit.adapter) == ("base-m", "support-lora")
    assert audit.engine_version == "vllm 0.32.0"
    assert audit.trace_id == span.trace_id == TRACE_ID
    assert sent_headers["traceparent"] == f"00-{TRACE_ID}-{span.span_id}-01"


def test_streaming_passes_through_and_is_audited() -> None:
    published: list = []
    body = {**CHAT, "stream": True}
    with FakeUpstream(vllm=True) as upstream, _gateway(upstream, published) as client:
        with client.stream("POST", "/v1/chat/completions", json=body, headers=HEADERS) as answer:
            streamed = b"".join(answer.iter_raw())
    assert streamed.endswith(b"data: [DONE]\n\n") and streamed.count(b"data:") == 3
    records = _by_type(published)
    (audit,) = records[Audit]
    assert audit.response.startswith("Hello there, Mail [EMAIL:")
    assert EMAIL not in audit.response and audit.redactions == {"email": 2, "phone": 2}
    assert audit.sampling["stream"] is True
    (span,) = records[Span]
    assert span.ttft_s is not None and span.status == "ok"


def _events(stream: bytes) -> list:
    return [json.loads(line[5:]) for line in stream.split(b"\n") if line.startswith(b"data: {")]


def test_streaming_from_openai_engine_strips_logprobs_and_ships_approximate_entropy() -> None:
    published: list = []
    body = {**CHAT, "stream": True}
    with FakeUpstream() as upstream, _gateway(upstream, published) as client:
        with client.stream("POST", "/v1/chat/completions", json=body, headers=HEADERS) as answer:
            streamed = b"".join(answer.iter_raw())
        direct = httpx.post(f"{upstream.url}/v1/chat/completions", json=body).content
        assert upstream.received[0][1]["logprobs"] is True and upstream.received[0][1]["top_logprobs"] == 20
    assert _events(streamed) == _events(direct)  # what the engine would have streamed to the client
    assert all(e["choices"][0]["logprobs"] is None for e in _events(streamed))
    assert streamed.endswith(b"data: [DONE]\n\n")
    records = _by_type(published)
    (audit,) = records[Audit]
    (tokens,) = records[TokenEntropy]
    assert tokens.approximate and tokens.trace_id == audit.trace_id == TRACE_ID
    np.testing.assert_allclose(tokens.values(), EXPECTED_ENTROPIES, atol=1e-3)
    assert tokens.hashes().tolist() == EXPECTED_HASHES  # gathered event by event, still aligned
    np.testing.assert_allclose(tokens.surprisal_values(), EXPECTED_SURPRISALS, atol=1e-3)
    assert EMAIL not in audit.response and audit.response.startswith("Hello there, Mail [EMAIL:")


def test_upstream_down_gives_502_and_an_error_span() -> None:
    published: list = []
    config = GatewayConfig(upstream="http://127.0.0.1:9", engine="openai", timeout_s=2)
    with TestClient(create_app(config, published.append, PiiRedactor(KEY))) as client:
        answer = client.post("/v1/chat/completions", json=CHAT, headers=HEADERS)
    assert answer.status_code == 502
    (span,) = published
    assert isinstance(span, Span) and span.status == "error" and span.trace_id == TRACE_ID


def test_other_paths_are_proxied() -> None:
    with FakeUpstream(vllm=True) as upstream, _gateway(upstream, []) as client:
        models = client.get("/v1/models").json()
    assert [m["id"] for m in models["data"]] == ["base-m", "support-lora"]


def test_a_named_vllm_engine_still_records_the_engine_version_in_the_audit() -> None:
    """``--engine vllm`` skips guessing the engine, not asking its version (the audit's engine_version)."""
    published: list = []
    with FakeUpstream(vllm=True) as upstream, _gateway(upstream, published, engine="vllm") as client:
        assert client.post("/v1/chat/completions", json={**CHAT, "model": "base-m"}, headers=HEADERS).status_code == 200
    (audit,) = _by_type(published)[Audit]
    assert audit.engine_version == "vllm 0.32.0"
