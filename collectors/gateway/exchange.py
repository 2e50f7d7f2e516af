"""One audited request as it goes through the gateway: what was asked, what came back, how it ended."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from opentelemetry import trace


@dataclass
class Exchange:
    """Everything the records of one request are built from (filled in as the request proceeds)."""

    path: str
    body: dict[str, Any]
    headers: dict[str, str]
    span: trace.Span  # the gateway's OTel span of this request (tracing.py); its ids are the records' ids
    request_id: str
    engine: str
    start: float
    tenant: str = ""  # the API key's tenant; without keys, the X-Entroloop-Tenant header
    model: str = ""
    adapter: str = ""
    routed: str = ""  # "canary" or "stable" when adapter routing chose the served model, else ""
    end: float = 0.0
    ttft_s: float | None = None
    status_code: int = 0
    outcome: str = "ok"  # ok | upstream_error | client_disconnected (Audit.outcome)
    error: str = ""  # what went wrong upstream, for the span (no request data in it)
    response: dict[str, Any] = field(default_factory=dict)
    entropies: list[float] = field(default_factory=list)
    token_hashes: list[int] | None = None
    surprisals: list[float] | None = None  # the sampled tokens' surprisals (non-vLLM engines' logprobs)
    """A hash of each sampled token, aligned with ``entropies``; None when the engine did not name them."""

    @property
    def trace_id(self) -> str:
        """The trace id (32 hex digits): the client's, or the one the gateway started."""
        return trace.format_trace_id(self.span.get_span_context().trace_id)

    @property
    def span_id(self) -> str:
        """The gateway span's id (16 hex digits): the parent of the engine's span."""
        return trace.format_span_id(self.span.get_span_context().span_id)


__all__ = ["Exchange"]
