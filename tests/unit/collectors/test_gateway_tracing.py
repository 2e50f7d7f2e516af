"""The gateway's spans through the OpenTelemetry SDK: the client's W3C ``traceparent`` is honoured,
an invalid one starts a new trace, the engine is told the gateway's span is its parent, the spans
become Span records and, with ENTROLOOP_GATEWAY_OTLP_ENDPOINT, reach a real OTLP/HTTP receiver.

Real sockets throughout: a fake OpenAI-compatible engine served by uvicorn and an HTTP server that
decodes the protobuf ``ExportTraceServiceRequest`` as an OTel collector would.
"""

from __future__ import annotations

import re
import socket

import pytest
from entroloop.collectors.gateway.app import (
    GatewayConfig,
    GatewayConfigError,
    app_from_settings,
    create_app,
)
from entroloop.collectors.gateway.tracing import otlp_traces_url
from starlette.testclient import TestClient

from entroloop.contract import codec
from entroloop.contract.records import Audit, Span, TokenEntropy
from entroloop.contract.settings import SettingsError, load_settings
from entroloop.infra.pii import PiiRedactor
from tests.unit.collectors.fake_openai_upstream import FakeUpstream
from tests.unit.collectors.otlp_receiver import OtlpReceiver

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CLIENT_PARENT = "b7ad6b7169203331"
TRACESTATE = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
EMAIL = "dana.white@example.org"
CHAT = {"model": "base-m", "messages": [{"role": "user", "content": f"I am {EMAIL}"}], "user": "dana-7"}
HEX32, HEX16 = re.compile(r"^[0-9a-f]{32}$"), re.compile(r"^[0-9a-f]{16}$")


def _app(upstream: FakeUpstream, published: list, engine: str = "openai", **config: object) -> TestClient:
    gateway_config = GatewayConfig(upstream=upstream.url, engine=engine, node_id="gw-t", route="support",
                                   **config)  # type: ignore[arg-type]
    return TestClient(create_app(gateway_config, published.append, PiiRedactor(b"k")))


def _sampled_child_of(traceparent: str, span: Span) -> bool:
    """``traceparent`` names ``span`` as parent, flagged sampled. A trace the gateway starts also has
    W3C Trace Context level 2's ``random`` flag (0x02: the SDK draws its trace ids at random)."""
    version, trace_id, parent_id, flags = traceparent.split("-")
    return (version, trace_id, parent_id) == ("00", span.trace_id, span.span_id) and int(flags, 16) & 1 == 1


def _one(published: list, kind: type) -> object:
    (record,) = [r for r in published if isinstance(r, kind)]
    return record


def test_the_clients_traceparent_and_tracestate_are_honoured() -> None:
    published: list = []
    headers = {"traceparent": f"00-{TRACE_ID}-{CLIENT_PARENT}-01", "tracestate": TRACESTATE, "X-Request-Id": "t-1"}
    with FakeUpstream() as upstream, _app(upstream, published) as client:
        answer = client.post("/v1/chat/completions", json=CHAT, headers=headers)
        assert answer.status_code == 200 and answer.headers["x-request-id"] == "t-1"
        (_, _, sent) = upstream.received[-1]
    span, audit, tokens = _one(published, Span), _one(published, Audit), _one(published, TokenEntropy)
    # the gateway's span is the child of the client's span, in the client's trace ...
    assert (span.trace_id, span.parent_span_id) == (TRACE_ID, CLIENT_PARENT)
    assert HEX16.match(span.span_id) and span.span_id != CLIENT_PARENT
    # ... and the engine is told the gateway's span is its parent, the client's tracestate kept
    assert sent["traceparent"] == f"00-{TRACE_ID}-{span.span_id}-01"
    assert sent["tracestate"] == TRACESTATE
    assert audit.trace_id == tokens.trace_id == TRACE_ID
    assert span.request_id == audit.request_id == tokens.request_id == "t-1"
    # the record is the one the consumers always had
    assert (span.name, span.model, span.route, span.status, span.node_id) == (
        "gateway /v1/chat/completions", "base-m", "support", "ok", "gw-t")
    assert (span.prompt_tokens, span.output_tokens) == (9, 2)
    assert span.e2e_s == pytest.approx(span.end_time - span.start_time, abs=1e-6) and 0 <= span.e2e_s < 10
    assert span.attributes["http.status_code"] == 200 and span.attributes["entroloop.engine"] == "openai"
    assert codec.decode(codec.encode(span)) == span
    # one node sequence across the three kinds of record (the Span is stamped by the gateway's stamper)
    assert sorted(r.seq for r in published) == list(range(len(published)))


def test_a_streamed_vllm_request_gives_the_trace_to_the_tap_and_the_engine() -> None:
    published: list = []
    headers = {"TraceParent": f"00-{TRACE_ID}-{CLIENT_PARENT}-01"}  # header names are case-insensitive
    with FakeUpstream(vllm=True) as upstream, _app(upstream, published, engine="vllm") as client:
        answer = client.post("/v1/chat/completions", json={**CHAT, "stream": True}, headers=headers)
        assert answer.status_code == 200 and "[DONE]" in answer.text
        (_, body, sent) = upstream.received[-1]
    span = _one(published, Span)
    assert body["vllm_xargs"]["entroloop_trace_id"] == TRACE_ID == span.trace_id
    assert sent["traceparent"] == f"00-{TRACE_ID}-{span.span_id}-01"
    assert span.parent_span_id == CLIENT_PARENT and span.ttft_s is not None and span.status == "ok"


def test_a_client_that_did_not_sample_still_gets_its_span_in_its_trace() -> None:
    """The Span records are entroloop's latency data: every request is recorded. The gateway did
    record, so it tells the engine ``sampled`` and vLLM records its span too."""
    published: list = []
    with FakeUpstream() as upstream, _app(upstream, published) as client:
        client.post("/v1/chat/completions", json=CHAT, headers={"traceparent": f"00-{TRACE_ID}-{CLIENT_PARENT}-00"})
        (_, _, sent) = upstream.received[-1]
    span = _one(published, Span)
    assert (span.trace_id, span.parent_span_id) == (TRACE_ID, CLIENT_PARENT)
    assert sent["traceparent"] == f"00-{TRACE_ID}-{span.span_id}-01"


@pytest.mark.parametrize("bad", [
    "",
    "garbage",
    f"00-{'0' * 32}-{CLIENT_PARENT}-01",  # all-zero trace id
    f"00-{TRACE_ID}-{'0' * 16}-01",  # all-zero parent id
    f"ff-{TRACE_ID}-{CLIENT_PARENT}-01",  # version ff is invalid
    f"00-{TRACE_ID.upper()}-{CLIENT_PARENT}-01",  # hex must be lowercase
    f"00-{TRACE_ID}-{CLIENT_PARENT}-01-extra",  # version 00 has exactly four fields
    f"00-{TRACE_ID[:-1]}-{CLIENT_PARENT}-01",  # a digit short
])
def test_an_invalid_traceparent_starts_a_new_trace(bad: str) -> None:
    published: list = []
    with FakeUpstream() as upstream, _app(upstream, published) as client:
        answer = client.post("/v1/chat/completions", json=CHAT, headers={"traceparent": bad, "tracestate": TRACESTATE})
        assert answer.status_code == 200
        (_, _, sent) = upstream.received[-1]
    span, audit = _one(published, Span), _one(published, Audit)
    assert HEX32.match(span.trace_id) and span.trace_id not in (TRACE_ID, "0" * 32)
    assert span.parent_span_id == ""  # the gateway's span is the root of the new trace
    assert audit.trace_id == span.trace_id
    assert _sampled_child_of(sent["traceparent"], span)
    assert "tracestate" not in sent  # the spec: a tracestate without a valid traceparent is dropped


def test_each_request_without_a_traceparent_starts_its_own_trace() -> None:
    published: list = []
    with FakeUpstream() as upstream, _app(upstream, published) as client:
        for _ in range(2):
            assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
        sent = [h["traceparent"] for path, _, h in upstream.received if path == "/v1/chat/completions"]
    spans = [r for r in published if isinstance(r, Span)]
    assert len(spans) == 2 and spans[0].trace_id != spans[1].trace_id
    assert all(s.parent_span_id == "" and HEX32.match(s.trace_id) for s in spans)
    assert all(_sampled_child_of(header, s) for header, s in zip(sent, spans, strict=True))


def _settings_app(upstream: FakeUpstream, receiver_url: str, published: list, **settings: object) -> TestClient:
    values = {"node_id": "gw-otlp", "gateway_route": "support", "pii_hash_key": "otlp-test-key",
              "gateway_otlp_endpoint": receiver_url, **settings}
    return TestClient(app_from_settings(load_settings(**values), publish=published.append,
                                        upstream=upstream.url, engine="openai"))


def test_spans_reach_a_real_otlp_receiver_with_the_clients_trace_id() -> None:
    published: list = []
    headers = {"traceparent": f"00-{TRACE_ID}-{CLIENT_PARENT}-01", "X-Request-Id": "otlp-1"}
    # a base URL: /v1/traces is added. Leaving the client (first) runs the app's shutdown, which
    # flushes the OTLP batch while the receiver still listens.
    with OtlpReceiver() as receiver, FakeUpstream() as upstream, \
            _settings_app(upstream, receiver.url, published) as client:
        assert client.post("/v1/chat/completions", json=CHAT, headers=headers).status_code == 200
    assert receiver.paths == ["/v1/traces"]
    (exported,) = receiver.spans
    record = _one(published, Span)
    assert (exported.trace_id, exported.parent_span_id) == (TRACE_ID, CLIENT_PARENT)
    assert (exported.span_id, exported.name) == (record.span_id, record.name)  # the same span, both ways
    assert exported.attributes["entroloop.request_id"] == "otlp-1"
    assert exported.attributes["gen_ai.request.model"] == "base-m"
    assert exported.attributes["gen_ai.usage.output_tokens"] == 2
    assert exported.resource["service.name"] == "entroloop-gateway"
    assert exported.resource["service.instance.id"] == "gw-otlp"


def test_no_key_prompt_or_answer_in_any_span() -> None:
    client_key, engine_key = "sk-client-3f9a7c1d2e", "sk-engine-8b2c4d6e0f"
    published: list = []
    headers = {"Authorization": f"Bearer {client_key}", "traceparent": f"00-{TRACE_ID}-{CLIENT_PARENT}-01"}
    with OtlpReceiver() as receiver, FakeUpstream() as upstream, \
            _settings_app(upstream, receiver.url + "/v1/traces", published, gateway_api_keys=f"acme:{client_key}",
                          gateway_upstream_api_key=engine_key) as client:
        assert client.post("/v1/chat/completions", json=CHAT, headers=headers).status_code == 200
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 401  # the key is needed
        assert upstream.received[-1][2]["authorization"] == f"Bearer {engine_key}"  # was in the request
    span = _one(published, Span)
    assert span.trace_id == TRACE_ID and len(receiver.spans) == 1
    stored = [codec.encode(span), *receiver.bodies]
    for secret in (client_key, engine_key, EMAIL, "dana-7", "Hello there"):
        assert not any(secret.encode() in raw for raw in stored), secret
    assert not any(k.lower().startswith(("http.request.header", "authorization")) for k in span.attributes)


def test_an_unreachable_otlp_endpoint_never_fails_a_request(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "1")
    with socket.socket() as closed:  # a port nobody listens on
        closed.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{closed.getsockname()[1]}"
    published: list = []
    with FakeUpstream() as upstream, _settings_app(upstream, dead, published) as client:
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
    assert _one(published, Span).status == "ok"  # the Span record does not depend on the OTLP export


def test_the_otlp_endpoint_setting_is_checked_and_completed() -> None:
    with pytest.raises(SettingsError, match="ENTROLOOP_GATEWAY_OTLP_ENDPOINT.*http://"):
        load_settings(gateway_otlp_endpoint="otel-collector:4318")
    assert otlp_traces_url("http://otel:4318") == "http://otel:4318/v1/traces"
    assert otlp_traces_url("https://otel:4318/") == "https://otel:4318/v1/traces"
    assert otlp_traces_url("https://cloud.langfuse.com/api/public/otel/v1/traces") == \
        "https://cloud.langfuse.com/api/public/otel/v1/traces"


def test_an_sdk_switched_off_by_the_environment_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """OTEL_SDK_DISABLED=true would make every span invalid and every record's trace id all zeros."""
    monkeypatch.setenv("OTEL_SDK_DISABLED", "true")
    with pytest.raises(GatewayConfigError, match="OTEL_SDK_DISABLED=true .* unset it for the gateway"):
        create_app(GatewayConfig(upstream="http://127.0.0.1:9"), [].append, PiiRedactor(b"k"))
