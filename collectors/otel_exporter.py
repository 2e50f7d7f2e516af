"""An OpenTelemetry ``SpanExporter`` that publishes finished spans as ``entroloop.contract.records.Span``.

Usable by anything that traces with the OTel SDK:

* **vLLM's own tracing.** vLLM builds its ``llm_request`` span (attributes ``gen_ai.latency.*``,
  ``gen_ai.usage.*``, ``gen_ai.request.id``; names from ``vllm.tracing.utils.SpanAttributes``) with
  ``opentelemetry.trace.get_tracer`` – the *global* tracer provider – but only when
  ``--otlp-traces-endpoint`` is set, and then installs an OTLP-only provider itself. The OTel API
  keeps the first provider set in a process, so :func:`install_vllm_tracing` (registered as a
  ``vllm.general_plugins`` entry point, which vLLM loads in the API-server process before it
  creates the engine) installs a provider with this exporter first when
  ``ENTROLOOP_OTEL_SPANS_ENABLED=true``. vLLM's own provider is then refused by the OTel API, so
  the same provider also carries an :class:`OtlpAlongside` processor: it sends every span on to
  the user's OTLP endpoint (the ``--otlp-traces-endpoint`` vLLM was given, which vLLM exports as
  ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``; protocol from ``OTEL_EXPORTER_OTLP_TRACES_PROTOCOL``,
  grpc by default, as vLLM does). The user's Jaeger, Phoenix or Langfuse keeps receiving spans.
* **Any OTel-instrumented gateway**: ``provider.add_span_processor(BatchSpanProcessor(SpanRecordExporter()))``.

``export()`` never blocks on Kafka (the node publisher's ``publish`` is a queue append) and never
raises into the SDK: a span that cannot be converted or published is logged and counted.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)
from opentelemetry.trace import StatusCode

from entroloop.contract.ids import NodeStamper
from entroloop.contract.records import Span
from entroloop.contract.settings import Settings, load_settings

log = logging.getLogger(__name__)

Publish = Callable[[Span], object]

# Attribute names of vLLM's request span (vllm/tracing/utils.py SpanAttributes, vLLM 0.32).
ATTR_QUEUE = "gen_ai.latency.time_in_queue"
ATTR_TTFT = "gen_ai.latency.time_to_first_token"
ATTR_E2E = "gen_ai.latency.e2e"
ATTR_PREFILL = "gen_ai.latency.time_in_model_prefill"
ATTR_DECODE = "gen_ai.latency.time_in_model_decode"
ATTR_PROMPT_TOKENS = "gen_ai.usage.prompt_tokens"
ATTR_COMPLETION_TOKENS = "gen_ai.usage.completion_tokens"
ATTR_REQUEST_ID = "gen_ai.request.id"
# The current OTel GenAI semantic conventions name the same values differently; read both (the
# older vLLM names first: a span carrying both has them equal).
ATTR_INPUT_TOKENS = "gen_ai.usage.input_tokens"
ATTR_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
ATTR_RESPONSE_ID = "gen_ai.response.id"
# vLLM names the served model under gen_ai.response.model; OTel GenAI conventions use both.
ATTR_MODELS = ("gen_ai.request.model", "gen_ai.response.model")
# Set by entroloop's gateway (or any caller) to correlate with Audit and TokenEntropy records.
ATTR_ENTROLOOP_REQUEST_ID = "entroloop.request_id"
ATTR_ROUTE = "entroloop.route"

_TIMING_ATTRS = {ATTR_QUEUE, ATTR_TTFT, ATTR_E2E, ATTR_PREFILL, ATTR_DECODE, ATTR_PROMPT_TOKENS, ATTR_COMPLETION_TOKENS,
                 ATTR_INPUT_TOKENS, ATTR_OUTPUT_TOKENS}


def _float(attributes: Mapping[str, Any], name: str) -> float | None:
    value = attributes.get(name)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _int(attributes: Mapping[str, Any], *names: str) -> int | None:
    """The first of ``names`` that holds a number."""
    for name in names:
        value = attributes.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            return int(value)
    return None


def _scalar_attributes(attributes: Mapping[str, Any]) -> dict[str, str | int | float | bool]:
    """Everything not mapped to a typed field; sequences become comma-joined strings."""
    out: dict[str, str | int | float | bool] = {}
    for key, value in attributes.items():
        if key in _TIMING_ATTRS:
            continue
        if isinstance(value, str | int | float | bool):
            out[key] = value
        elif isinstance(value, Sequence):
            out[key] = ",".join(map(str, value))
    return out


def request_id_of(attributes: Mapping[str, Any], fallback: str) -> str:
    """entroloop's request id: set explicitly, else recovered from vLLM's id, else ``fallback``.

    vLLM's OpenAI server names a chat request ``chatcmpl-<X-Request-Id>`` and each prompt ``i`` of
    a completion request ``cmpl-<X-Request-Id>-<i>`` (always, so the last ``-<i>`` is vLLM's).
    """
    explicit = attributes.get(ATTR_ENTROLOOP_REQUEST_ID)
    if explicit:
        return str(explicit)
    vllm_id = str(attributes.get(ATTR_REQUEST_ID) or attributes.get(ATTR_RESPONSE_ID) or "")
    if vllm_id.startswith("chatcmpl-"):
        return vllm_id[len("chatcmpl-") :]
    if vllm_id.startswith("cmpl-"):
        base, dash, index = vllm_id[len("cmpl-") :].rpartition("-")
        return base if dash and index.isdigit() else vllm_id[len("cmpl-") :]
    return vllm_id or fallback


def span_to_record(span: ReadableSpan, stamp: dict[str, object], default_route: str = "default") -> Span:
    """One finished OTel span as a Span record (timings in seconds; ids as lowercase hex)."""
    context = span.get_span_context()
    attributes: Mapping[str, Any] = span.attributes or {}
    span_id = format(context.span_id, "016x")
    model = next((str(attributes[a]) for a in ATTR_MODELS if attributes.get(a)), "")
    request_id = request_id_of(attributes, span_id)
    completion = _int(attributes, ATTR_COMPLETION_TOKENS, ATTR_OUTPUT_TOKENS)
    decode = _float(attributes, ATTR_DECODE)
    # TPOT as vLLM defines it: decode time spread over the tokens after the first.
    tpot = decode / (completion - 1) if decode is not None and completion is not None and completion > 1 else None
    start = (span.start_time or 0) / 1e9
    end = (span.end_time or span.start_time or 0) / 1e9
    e2e = _float(attributes, ATTR_E2E)
    return Span(
        **stamp,  # type: ignore[arg-type]
        request_id=request_id,
        trace_id=format(context.trace_id, "032x"),
        span_id=span_id,
        parent_span_id=format(span.parent.span_id, "016x") if span.parent is not None else "",
        name=span.name,
        start_time=start,
        end_time=end,
        model=model,
        route=str(attributes.get(ATTR_ROUTE) or default_route),
        status="error" if span.status.status_code is StatusCode.ERROR else "ok",
        queue_s=_float(attributes, ATTR_QUEUE),
        prefill_s=_float(attributes, ATTR_PREFILL),
        decode_s=decode,
        ttft_s=_float(attributes, ATTR_TTFT),
        tpot_s=tpot,
        e2e_s=e2e if e2e is not None else (end - start if span.end_time else None),
        prompt_tokens=_int(attributes, ATTR_PROMPT_TOKENS, ATTR_INPUT_TOKENS),
        output_tokens=completion,
        attributes=_scalar_attributes(attributes),
    )


class SpanRecordExporter(SpanExporter):
    """Publishes each finished span as a Span record through ``publish`` (default: the node publisher)."""

    def __init__(
        self,
        publish: Publish | None = None,
        settings: Settings | None = None,
        node_id: str | None = None,
        route: str | None = None,
    ) -> None:
        self._settings = settings
        self._publish = publish
        self._lock = threading.Lock()
        resolved = settings or load_settings()
        self.stamper = NodeStamper(node_id or resolved.node_id)
        self.route = route or resolved.gateway_route
        self.exported = 0
        self.errors = 0
        self._shutdown = False

    def _publisher(self) -> Publish:
        # Built on first export, in the exporting thread's process (vLLM forks engine processes).
        if self._publish is None:
            with self._lock:
                if self._publish is None:
                    from entroloop.collectors.vllm.emit import resolve_sink

                    self._publish = resolve_sink("publisher", self._settings or load_settings())
        return self._publish

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if self._shutdown:
            return SpanExportResult.FAILURE
        try:
            publish = self._publisher()
        except Exception:  # noqa: BLE001 - a broken configuration must not break the traced app
            self.errors += len(spans)
            log.exception("entroloop span exporter: no publisher, %d spans dropped", len(spans))
            return SpanExportResult.FAILURE
        failed = False
        for span in spans:
            try:
                publish(span_to_record(span, self.stamper.stamp(), self.route))
                self.exported += 1
            except Exception:  # noqa: BLE001 - never raise into the OTel SDK
                self.errors += 1
                failed = True
                log.exception("entroloop span exporter: span %s not published", getattr(span, "name", "?"))
        return SpanExportResult.FAILURE if failed else SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self._shutdown = True

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


OTLP_ENDPOINT_ENV = "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
OTLP_PROTOCOL_ENV = "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"


def otlp_exporter(endpoint: str, protocol: str = "grpc") -> SpanExporter:
    """The OTLP span exporter vLLM itself would build for ``endpoint`` (grpc or http/protobuf).

    Raises ``ValueError`` for another protocol and ``ImportError`` when the OTLP exporter package
    (``opentelemetry-exporter-otlp``, installed with vLLM and entroloop's gateway/vllm extras) is missing."""
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
            OTLPSpanExporter as Grpc,
        )

        return Grpc(endpoint=endpoint, insecure=True)
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as Http,
        )

        return Http(endpoint=endpoint)
    raise ValueError(f"{OTLP_PROTOCOL_ENV}={protocol!r}: use grpc or http/protobuf")


class OtlpAlongside(SpanProcessor):
    """Sends every span on to the user's OTLP endpoint, next to entroloop's exporter.

    The endpoint is looked up when the first span ends, not at start-up: vLLM publishes its
    ``--otlp-traces-endpoint`` in ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` only once it initialises
    tracing, after the plugin that installed this processor ran. ``endpoint`` given: that one. No
    endpoint anywhere: spans go to entroloop only. A broken OTLP set-up is logged once and never
    breaks the traced process."""

    def __init__(self, endpoint: str | None = None, batch: bool = True,
                 environ: Mapping[str, str] | None = None) -> None:
        import os

        self._endpoint = endpoint
        self._batch = batch
        self._environ = os.environ if environ is None else environ
        self._lock = threading.Lock()
        self._delegate: SpanProcessor | None = None
        self._resolved = False
        self.endpoint: str | None = None

    def _processor(self) -> SpanProcessor | None:
        if self._resolved:
            return self._delegate
        with self._lock:
            if not self._resolved:
                endpoint = self._endpoint or self._environ.get(OTLP_ENDPOINT_ENV, "")
                if endpoint:
                    try:
                        exporter = otlp_exporter(endpoint, self._environ.get(OTLP_PROTOCOL_ENV, "grpc"))
                        self._delegate = BatchSpanProcessor(exporter) if self._batch else SimpleSpanProcessor(exporter)
                        self.endpoint = endpoint
                        log.info("entroloop: spans also go to the OTLP endpoint %s", endpoint)
                    except (ImportError, ValueError) as exc:
                        log.error("entroloop: spans are not sent to the OTLP endpoint %s: %s", endpoint, exc)
                self._resolved = True
        return self._delegate

    def on_start(self, span: Any, parent_context: Any = None) -> None:
        processor = self._processor()
        if processor is not None:
            processor.on_start(span, parent_context=parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        processor = self._processor()
        if processor is not None:
            processor.on_end(span)

    def shutdown(self) -> None:
        if self._delegate is not None:
            self._delegate.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self._delegate.force_flush(timeout_millis) if self._delegate is not None else True


_installed = False


def tracer_provider(exporter: SpanExporter | None = None, batch: bool = True, otlp_endpoint: str | None = None,
                    environ: Mapping[str, str] | None = None) -> TracerProvider:
    """A TracerProvider whose spans go to entroloop (``exporter``) and to the user's OTLP endpoint."""
    provider = TracerProvider()
    exporter = exporter or SpanRecordExporter()
    # Batch: export runs on the SDK's worker thread, never on the request path.
    provider.add_span_processor(BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
    provider.add_span_processor(OtlpAlongside(otlp_endpoint, batch=batch, environ=environ))
    return provider


def install_tracer_provider(exporter: SpanExporter | None = None, batch: bool = True,
                            otlp_endpoint: str | None = None) -> Any:
    """Make :func:`tracer_provider` the process's global one (the first one set wins)."""
    global _installed
    from opentelemetry import trace

    provider = tracer_provider(exporter, batch, otlp_endpoint)
    trace.set_tracer_provider(provider)
    _installed = True
    return provider


def install_vllm_tracing() -> None:
    """vLLM general plugin: with ENTROLOOP_OTEL_SPANS_ENABLED=true, route vLLM's spans to entroloop."""
    if _installed:
        return
    try:
        settings = load_settings()
        if not settings.otel_spans_enabled:
            return
        install_tracer_provider(SpanRecordExporter(settings=settings))
        log.info("entroloop: vLLM spans are published as Span records (needs --otlp-traces-endpoint set)")
    except Exception:  # noqa: BLE001 - a plugin must never stop vLLM from starting
        log.exception("entroloop: could not install the span exporter")


__all__ = [
    "OtlpAlongside",
    "SpanRecordExporter",
    "install_tracer_provider",
    "install_vllm_tracing",
    "otlp_exporter",
    "span_to_record",
    "tracer_provider",
]
