"""The gateway's request spans, made with the OpenTelemetry SDK and W3C trace context.

One SERVER span per audited request (``gateway /v1/chat/completions``). Its parent is the client's
``traceparent`` (and ``tracestate``), read by OpenTelemetry's ``TraceContextTextMapPropagator``: a
missing or invalid header (bad hex, all-zero ids, version ``ff``, uppercase) starts a new trace, as
the W3C spec says. The same propagator writes the ``traceparent`` of the request to the engine with
the gateway's span as parent, so vLLM's ``llm_request`` span, the tap's TokenEntropy and the
gateway's Audit all carry the client's trace id.

The TracerProvider is the gateway's own, never the process's global one: a provider the
application (or vLLM) installed in the same process is left alone, and each app has its own
processors. Two processors:

* ``SpanRecordProcessor``: each finished span becomes entroloop's ``Span`` record by the same
  conversion as vLLM's spans (``otel_exporter.span_to_record``), stamped by the gateway's
  NodeStamper (one ``seq`` per node across Audit, Span and TokenEntropy) and published when the
  span ends (the node publisher's ``publish`` is a queue append, and the span ends after the
  answer has gone to the client);
* with ``ENTROLOOP_GATEWAY_OTLP_ENDPOINT``: a ``BatchSpanProcessor`` with the OTLP/HTTP exporter,
  so Jaeger, Phoenix, Langfuse or an OTel collector receive the same spans (headers such as an
  auth token come from the standard ``OTEL_EXPORTER_OTLP_HEADERS``).

Every request is recorded whatever the client's ``sampled`` flag: the Span records are entroloop's
latency data, not a sample. The gateway's span is therefore sampled, and says so to the engine,
which then records its own span too.

Span attributes hold ids, model, route, status, timings and token counts only: never a header, a
prompt, a response or a key.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit, urlunsplit

from entroloop.collectors.gateway.auth import GatewayConfigError
from entroloop.collectors.gateway.exchange import Exchange
from entroloop.collectors.otel_exporter import (
    ATTR_E2E,
    ATTR_ENTROLOOP_REQUEST_ID,
    ATTR_INPUT_TOKENS,
    ATTR_OUTPUT_TOKENS,
    ATTR_ROUTE,
    ATTR_TTFT,
    otlp_exporter,
    span_to_record,
)
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import SpanKind, Status, StatusCode
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from entroloop.contract.ids import NodeStamper
from entroloop.contract.records import Span

log = logging.getLogger(__name__)

SERVICE_NAME = "entroloop-gateway"
OTLP_TRACES_PATH = "/v1/traces"
ATTR_MODEL = "gen_ai.request.model"
ATTR_OPERATION = "gen_ai.operation.name"

_PROPAGATOR = TraceContextTextMapPropagator()


def otlp_traces_url(endpoint: str) -> str:
    """The URL spans are POSTed to: ``endpoint`` as given, or with ``/v1/traces`` when it has no path
    (``http://jaeger:4318`` is a collector's base address, as in ``OTEL_EXPORTER_OTLP_ENDPOINT``)."""
    parts = urlsplit(endpoint)
    if parts.path in ("", "/"):
        return urlunsplit(parts._replace(path=OTLP_TRACES_PATH))
    return endpoint


class SpanRecordProcessor(SpanProcessor):
    """Publishes each finished span as a ``Span`` record; never raises into the SDK or the request."""

    def __init__(self, publish: Callable[[Span], object], stamper: NodeStamper, route: str) -> None:
        self.publish = publish
        self.stamper = stamper
        self.route = route
        self.published = 0
        self.errors = 0

    def on_end(self, span: ReadableSpan) -> None:
        try:
            at = (span.end_time or span.start_time or 0) / 1e9
            self.publish(span_to_record(span, self.stamper.stamp(at), self.route))
            self.published += 1
        except Exception:  # a lost span record must not break the request
            self.errors += 1
            log.exception("entroloop gateway: span %s not published", span.name)


def _count(value: object) -> int | None:
    """A token count from the engine's ``usage``, or None for anything that is not one."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


class GatewayTracing:
    """The gateway's tracer provider, its propagation in and out, and its processors."""

    def __init__(
        self,
        publish: Callable[[Span], object],
        stamper: NodeStamper,
        route: str,
        otlp_endpoint: str = "",
    ) -> None:
        if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
            # the SDK would hand out invalid spans: every record would carry an all-zero trace id
            raise GatewayConfigError(
                "OTEL_SDK_DISABLED=true switches off the OpenTelemetry SDK the gateway makes its request spans "
                "and trace ids with: unset it for the gateway (to send no spans anywhere but entroloop, leave "
                "ENTROLOOP_GATEWAY_OTLP_ENDPOINT empty)")
        self.route = route
        resource = Resource.create({"service.name": SERVICE_NAME, "service.instance.id": stamper.node_id})
        self.provider = TracerProvider(resource=resource, sampler=ALWAYS_ON)
        self.records = SpanRecordProcessor(publish, stamper, route)
        self.provider.add_span_processor(self.records)
        self.otlp_url = ""
        if otlp_endpoint:
            self.otlp_url = otlp_traces_url(otlp_endpoint)
            # Batch: the OTLP POST runs on the SDK's worker thread, never on the request path.
            self.provider.add_span_processor(BatchSpanProcessor(otlp_exporter(self.otlp_url, "http/protobuf")))
            log.info("entroloop gateway: spans also go to the OTLP/HTTP endpoint %s", self.otlp_url)
        self.tracer = self.provider.get_tracer("entroloop.gateway")

    def start(self, path: str, headers: Mapping[str, str], start: float, request_id: str) -> trace.Span:
        """The request's span, child of the client's ``traceparent`` (``headers`` lowercased) or a new trace."""
        parent = _PROPAGATOR.extract(headers)
        operation = "chat" if path.endswith("chat/completions") else "text_completion"
        return self.tracer.start_span(
            f"gateway {path}",
            context=parent,
            kind=SpanKind.SERVER,
            start_time=int(start * 1e9),
            attributes={ATTR_ENTROLOOP_REQUEST_ID: request_id, ATTR_ROUTE: self.route, ATTR_OPERATION: operation},
        )

    @staticmethod
    def inject(span: trace.Span, headers: dict[str, str]) -> None:
        """Write ``traceparent`` (and ``tracestate``) naming ``span`` as the parent of the engine's work."""
        _PROPAGATOR.inject(headers, context=trace.set_span_in_context(span))

    def end(self, exchange: Exchange) -> None:
        """End the request's span with what the exchange learnt (publishes its Span record)."""
        span = exchange.span
        usage = exchange.response.get("usage") or {}
        ok = exchange.status_code == 200 and bool(exchange.response) and exchange.outcome == "ok"
        attributes: dict[str, str | int | float | bool] = {
            "http.status_code": exchange.status_code,
            "entroloop.engine": exchange.engine,
            "entroloop.adapter": exchange.adapter,
            "entroloop.routed": exchange.routed,
            "entroloop.stream": bool(exchange.body.get("stream")),
            "entroloop.outcome": exchange.outcome,
            ATTR_E2E: exchange.end - exchange.start,
        }
        if exchange.model:
            attributes[ATTR_MODEL] = exchange.model
        if exchange.ttft_s is not None:
            attributes[ATTR_TTFT] = exchange.ttft_s
        for name, key in ((ATTR_INPUT_TOKENS, "prompt_tokens"), (ATTR_OUTPUT_TOKENS, "completion_tokens")):
            count = _count(usage.get(key)) if isinstance(usage, dict) else None
            if count is not None:
                attributes[name] = count
        if exchange.error:
            attributes["error.message"] = exchange.error[:500]
        span.set_attributes(attributes)
        if not ok:
            span.set_status(Status(StatusCode.ERROR, exchange.error[:500] or f"HTTP {exchange.status_code}"))
        span.end(end_time=int(exchange.end * 1e9))

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.provider.force_flush(timeout_millis)

    def shutdown(self) -> None:
        """Flush and stop the processors (the OTLP batch is sent before the gateway exits)."""
        self.provider.shutdown()


__all__ = ["GatewayTracing", "SpanRecordProcessor", "otlp_traces_url"]
