"""Span capture next to the user's own OpenTelemetry backend (issue 13 item 3).

vLLM 0.32 (vllm/tracing/otel.py) exports ``--otlp-traces-endpoint`` as
``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``, builds its own TracerProvider with an OTLP exporter and
calls ``set_tracer_provider``, and then creates its ``llm_request`` span through the *global*
tracer. With entroloop's plugin installed first, vLLM's provider is refused; these tests check that
the user's OTLP collector (a real OTLP/HTTP endpoint here, decoded with the OTel protobufs) still
gets every span, and entroloop gets the same spans as Span records.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from entroloop.collectors.otel_exporter import (
    OtlpAlongside,
    span_to_record,
    tracer_provider,
)
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
)

from entroloop.contract.ids import NodeStamper


@pytest.fixture
def otlp_collector():
    """A minimal OTLP/HTTP trace receiver: POST /v1/traces bodies decoded into span names + trace ids."""
    received: list[tuple[str, str]] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            body = self.rfile.read(int(self.headers["Content-Length"]))
            request = ExportTraceServiceRequest.FromString(body)
            for resource in request.resource_spans:
                for scope in resource.scope_spans:
                    received.extend((s.name, s.trace_id.hex()) for s in scope.spans)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/v1/traces", received
    server.shutdown()


class Collect:
    """An in-memory SpanExporter standing in for entroloop's publisher."""

    def __init__(self):
        self.spans = []

    def export(self, spans):
        from opentelemetry.sdk.trace.export import SpanExportResult

        self.spans.extend(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass

    def force_flush(self, timeout_millis=30000):
        return True


def test_spans_reach_entroloop_and_the_users_otlp_endpoint(otlp_collector):
    url, received = otlp_collector
    entroloop = Collect()
    provider = tracer_provider(entroloop, batch=False,
                               environ={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": url,
                                        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"})
    span = provider.get_tracer("vllm").start_span("llm_request", attributes={"gen_ai.usage.output_tokens": 7})
    span.end()
    provider.shutdown()
    trace_id = format(span.get_span_context().trace_id, "032x")
    assert [s.name for s in entroloop.spans] == ["llm_request"]
    assert received == [("llm_request", trace_id)]


def test_no_endpoint_means_entroloop_only_and_a_bad_protocol_never_breaks_tracing(otlp_collector, caplog):
    url, received = otlp_collector
    entroloop = Collect()
    provider = tracer_provider(entroloop, batch=False, environ={})
    provider.get_tracer("t").start_span("a").end()
    bad = OtlpAlongside(batch=False, environ={"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": url,
                                               "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "carrier-pigeon"})
    provider.add_span_processor(bad)
    provider.get_tracer("t").start_span("b").end()
    provider.shutdown()
    assert [s.name for s in entroloop.spans] == ["a", "b"]
    assert received == []
    assert "carrier-pigeon" in caplog.text


def test_the_endpoint_is_read_when_the_first_span_ends_not_at_install():
    environ: dict[str, str] = {}
    alongside = OtlpAlongside(batch=False, environ=environ)
    environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = "http://127.0.0.1:9/v1/traces"  # set later, as vLLM does
    environ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
    assert alongside._processor() is not None
    assert alongside.endpoint == "http://127.0.0.1:9/v1/traces"


def test_current_gen_ai_names_are_read_besides_vllms():
    provider = tracer_provider(Collect(), batch=False, environ={})
    span = provider.get_tracer("t").start_span("chat", attributes={
        "gen_ai.usage.input_tokens": 12, "gen_ai.usage.output_tokens": 5, "gen_ai.response.id": "chatcmpl-abc123",
        "gen_ai.latency.time_in_model_decode": 0.4,
    })
    span.end()
    record = span_to_record(span, NodeStamper("n1").stamp())
    assert (record.prompt_tokens, record.output_tokens, record.request_id) == (12, 5, "abc123")
    assert record.tpot_s == pytest.approx(0.1)
    assert "gen_ai.usage.input_tokens" not in record.attributes


def test_in_a_process_like_vllm_the_users_exporter_still_receives_spans(otlp_collector):
    """The whole sequence in a fresh process (the global provider is once per process): entroloop's
    plugin installs first, then vLLM's own initialisation runs exactly as vllm/tracing/otel.py does."""
    url, received = otlp_collector
    script = textwrap.dedent(f"""
        import os
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
        from entroloop.collectors.otel_exporter import install_tracer_provider, otlp_exporter

        class Collect:
            spans = []
            def export(self, spans):
                self.spans.extend(spans); return SpanExportResult.SUCCESS
            def shutdown(self): pass
            def force_flush(self, timeout_millis=0): return True

        ours = Collect()
        provider = install_tracer_provider(ours, batch=False)           # the vllm.general_plugins hook
        os.environ["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] = "http/protobuf"
        os.environ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = {url!r}      # vLLM: init_otel_tracer
        vllm_provider = TracerProvider()
        vllm_provider.add_span_processor(SimpleSpanProcessor(otlp_exporter({url!r}, "http/protobuf")))
        trace.set_tracer_provider(vllm_provider)                         # refused: ours came first
        trace.get_tracer("vllm.tracing.otel").start_span("llm_request").end()  # manual_instrument_otel
        provider.shutdown()
        print(len(ours.spans))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "1"
    assert [name for name, _ in received] == ["llm_request"]
