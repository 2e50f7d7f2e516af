"""W3C trace context (``traceparent``) parsing and formatting, so spans, tokens and audit share a trace.

The gateway reads the client's ``traceparent`` (or starts a new trace), passes the same trace id to
the engine (as a ``traceparent`` header for vLLM's own tracing and as ``vllm_xargs.entroloop_trace_id``
for the entropy tap) and stamps it on its Audit and Span records. Pure standard library: the OTel
SDK is not needed to propagate the header.

Format (https://www.w3.org/TR/trace-context/): ``{version:2}-{trace_id:32}-{parent_id:16}-{flags:2}``,
lowercase hex, trace id and parent id never all zeros, version ``ff`` invalid.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from entroloop.contract.ids import new_span_id, new_trace_id

_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$")


@dataclass(frozen=True)
class TraceContext:
    """The incoming position in a trace: ``parent_span_id`` is empty when this hop starts the trace."""

    trace_id: str
    parent_span_id: str = ""
    sampled: bool = True
    tracestate: str = ""


def parse_traceparent(value: str | None) -> TraceContext | None:
    """A valid ``traceparent`` header as a TraceContext, or None (invalid headers are ignored, per spec)."""
    if not value:
        return None
    match = _TRACEPARENT.match(value.strip().lower())
    if not match:
        return None
    version, trace_id, parent_id, flags, rest = match.groups()
    if version == "ff" or (version == "00" and rest):
        return None
    if trace_id == "0" * 32 or parent_id == "0" * 16:
        return None
    return TraceContext(trace_id=trace_id, parent_span_id=parent_id, sampled=bool(int(flags, 16) & 1))


def format_traceparent(trace_id: str, span_id: str, sampled: bool = True) -> str:
    """The ``traceparent`` header naming ``span_id`` as the parent of the next hop."""
    return f"00-{trace_id}-{span_id}-{'01' if sampled else '00'}"


def extract(headers: Mapping[str, str]) -> TraceContext:
    """The caller's trace context from HTTP headers (case-insensitive), or a fresh trace."""
    lowered = {k.lower(): v for k, v in headers.items()}
    parsed = parse_traceparent(lowered.get("traceparent"))
    if parsed is None:
        return TraceContext(trace_id=new_trace_id())
    return TraceContext(parsed.trace_id, parsed.parent_span_id, parsed.sampled, lowered.get("tracestate", ""))


def inject(headers: dict[str, str], context: TraceContext, span_id: str | None = None) -> str:
    """Write ``traceparent`` (and ``tracestate``) for the next hop, child of ``span_id``; returns span_id."""
    span_id = span_id or new_span_id()
    headers["traceparent"] = format_traceparent(context.trace_id, span_id, context.sampled)
    if context.tracestate:
        headers["tracestate"] = context.tracestate
    return span_id


__all__ = ["TraceContext", "extract", "format_traceparent", "inject", "parse_traceparent"]
