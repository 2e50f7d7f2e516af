"""The span exporter: OTel spans (as vLLM and the gateway build them) become Span records."""

from __future__ import annotations

import time

import pytest
from entroloop.collectors.otel_exporter import SpanRecordExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.trace import SpanKind, Status, StatusCode, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from entroloop.contract import codec
from entroloop.contract.records import Span
from entroloop.contract.settings import load_settings


@pytest.fixture
def sink_and_tracer():
    published: list[Span] = []
    exporter = SpanRecordExporter(publish=published.append, settings=load_settings(node_id="gpu-7"))
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield published, provider.get_tracer("test"), exporter
    provider.shutdown()


def test_vllm_request_span_becomes_a_span_record_with_timings(sink_and_tracer) -> None:
    published, tracer, _ = sink_and_tracer
    # The incoming traceparent, as vLLM extracts it from the request headers.
    parent = TraceContextTextMapPropagator().extract(
        {"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
    )
    start_ns = time.time_ns()
    span = tracer.start_span(
        "llm_request",
        context=parent,
        kind=SpanKind.SERVER,
        start_time=start_ns,
        attributes={
            "gen_ai.latency.time_in_queue": 0.01,
            "gen_ai.latency.time_to_first_token": 0.25,
            "gen_ai.latency.e2e": 1.25,
            "gen_ai.latency.time_in_model_prefill": 0.2,
            "gen_ai.latency.time_in_model_decode": 0.9,
            "gen_ai.usage.prompt_tokens": 12,
            "gen_ai.usage.completion_tokens": 10,
            "gen_ai.response.model": "llama-3-8b",
            "gen_ai.request.id": "cmpl-req-42-0",  # vLLM: cmpl-<X-Request-Id>-<prompt index>
            "gen_ai.request.temperature": 0.7,
        },
    )
    span.end(end_time=start_ns + 1_250_000_000)

    assert len(published) == 1
    record = published[0]
    assert isinstance(record, Span)
    assert record.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert record.parent_span_id == "00f067aa0ba902b7"
    assert len(record.span_id) == 16 and record.span_id == format(span.get_span_context().span_id, "016x")
    assert record.request_id == "req-42"
    assert record.attributes["gen_ai.request.id"] == "cmpl-req-42-0"  # vLLM's own id kept
    assert record.name == "llm_request"
    assert record.model == "llama-3-8b"
    assert record.node_id == "gpu-7"
    assert record.status == "ok"
    assert (record.queue_s, record.ttft_s, record.e2e_s) == (0.01, 0.25, 1.25)
    assert (record.prefill_s, record.decode_s) == (0.2, 0.9)
    assert record.tpot_s == pytest.approx(0.1)  # 0.9 s over the 9 tokens after the first
    assert (record.prompt_tokens, record.output_tokens) == (12, 10)
    assert record.end_time - record.start_time == pytest.approx(1.25, abs=1e-6)
    assert record.attributes["gen_ai.request.temperature"] == 0.7
    assert "gen_ai.latency.e2e" not in record.attributes  # mapped, not duplicated
    assert codec.decode(codec.encode(record)) == record


def test_gateway_span_request_id_route_error_status_and_child_parent(sink_and_tracer) -> None:
    published, tracer, _ = sink_and_tracer
    with tracer.start_as_current_span("gateway", attributes={"entroloop.request_id": "r-1"}) as root:
        child = tracer.start_span(
            "upstream",
            context=set_span_in_context(root),
            attributes={"entroloop.route": "support", "gen_ai.request.model": "m", "tags": ("a", "b")},
        )
        child.set_status(Status(StatusCode.ERROR, "upstream 500"))
        child.end()
    upstream, gateway = published
    assert upstream.trace_id == gateway.trace_id
    assert upstream.parent_span_id == gateway.span_id
    assert gateway.parent_span_id == ""
    assert gateway.request_id == "r-1"
    assert upstream.request_id == upstream.span_id  # no id attribute: the span id
    assert (upstream.route, upstream.model, upstream.status) == ("support", "m", "error")
    assert upstream.attributes["tags"] == "a,b"
    assert gateway.route == "default" and gateway.status == "ok"
    assert gateway.e2e_s is not None and gateway.e2e_s >= 0
    assert gateway.ttft_s is None and gateway.tpot_s is None


def test_export_never_raises_when_the_sink_fails() -> None:
    def broken(_record: Span) -> None:
        raise RuntimeError("broker gone")

    exporter = SpanRecordExporter(publish=broken, settings=load_settings())
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("t")
    tracer.start_span("a").end()  # must not raise into the application
    tracer.start_span("b").end()
    assert exporter.errors == 2 and exporter.exported == 0


def test_request_id_recovered_from_vllm_ids() -> None:
    from entroloop.collectors.otel_exporter import request_id_of

    uuid_like = "01a2269f-7704-7bac-a421-ca0953e30012"  # ends in digits: only vLLM's index goes
    assert request_id_of({"gen_ai.request.id": f"cmpl-{uuid_like}-3"}, "f") == uuid_like
    assert request_id_of({"gen_ai.request.id": f"chatcmpl-{uuid_like}"}, "f") == uuid_like
    assert request_id_of({"gen_ai.request.id": "other-7"}, "f") == "other-7"
    assert request_id_of({"entroloop.request_id": "mine", "gen_ai.request.id": "cmpl-x-0"}, "f") == "mine"
    assert request_id_of({}, "f") == "f"
