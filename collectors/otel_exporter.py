"""An OpenTelemetry ``SpanExporter`` that publishes finished spans as ``entroloop.contract.records.Span``.

Usable by anything that traces with the OTel SDK:

* **vLLM's own tracing.** vLLM builds its ``llm_request`` span (attributes ``gen_ai.latency.*``,
  ``gen_ai.usage.*``, ``gen_ai.request.id``; names from ``vllm.tracing.utils.SpanAttributes``) with
  ``opentelemetry.trace.get_tracer`` – the *global* tracer provider – but only when
  ``--otlp-traces-endpoint`` is set, and then installs an OTLP-only provider itself. The OTel API
  keeps the first provider set in a process, so :func:`install_vllm_tracing` (registered as a
  ``vllm.general_plugins`` entry point, which vLLM loads in the API-server process before it
  creates the engine) installs a provider with this exporter first when
  ``ENTROLOOP_OTEL_SPANS_ENABLED=true``; vLLM's own OTLP provider is then never used. The
  ``--otlp-traces-endpoint`` value is still required to switch tracing on (any URL; nothing is
  sent to it).
* **Any OTel-instrumented gateway**: ``provider.add_span_processor(BatchSpanProcessor(SpanRecordExporter()))``.

``export()`` never blocks on Kafka (the node publisher's ``publish`` is a queue append) and never
raises into the SDK: a span that cannot be converted or published is logged and counted.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
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
# vLLM names the served model under gen_ai.response.model; OTel GenAI conventions use both.
ATTR_MODELS = ("gen_ai.request.model", "gen_ai.response.model")
# Set by entroloop's gateway (or any caller) to correlate with Audit and TokenEntropy records.
ATTR_ENTROLOOP_REQUEST_ID = "entroloop.request_id"
ATTR_ROUTE = "entroloop.route"

_TIMING_ATTRS = {ATTR_QUEUE, ATTR_TTFT, ATTR_E2E, ATTR_PREFILL, ATTR_DECODE, ATTR_PROMPT_TOKENS, ATTR_COMPLETION_TOKENS}


def _float(attributes: Mapping[str, Any], name: str) -> float | None:
    value = attributes.get(name)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _int(attributes: Mapping[str, Any], name: str) -> int | None:
    value = attributes.get(name)
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


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
    vllm_id = str(attributes.get(ATTR_REQUEST_ID) or "")
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
    completion = _int(attributes, ATTR_COMPLETION_TOKENS)
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
        prompt_tokens=_int(attributes, ATTR_PROMPT_TOKENS),
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
                    from collectors.vllm.emit import resolve_sink

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


_installed = False


def install_tracer_provider(exporter: SpanExporter | None = None, batch: bool = True) -> Any:
    """Make a TracerProvider exporting to entroloop the process's global one (first one set wins)."""
    global _installed
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    provider = TracerProvider()
    exporter = exporter or SpanRecordExporter()
    # Batch: export runs on the SDK's worker thread, never on the request path.
    provider.add_span_processor(BatchSpanProcessor(exporter) if batch else SimpleSpanProcessor(exporter))
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


__all__ = ["SpanRecordExporter", "install_tracer_provider", "install_vllm_tracing", "span_to_record"]
