"""Hand-built records for the stream-analytics unit tests (one place, so tests stay short)."""

from __future__ import annotations

import itertools

from entroloop.contract.ids import derived_event_id
from entroloop.contract.records import (
    Audit,
    BadCase,
    Fallback,
    Feedback,
    TokenEntropy,
    pack_entropies,
)

_seq = itertools.count()


def _common(request_id: str, at: float, node: str = "node-a") -> dict[str, object]:
    seq = next(_seq)
    return {
        "event_id": derived_event_id(request_id, node, seq, at=at),
        "emitted_at": at,
        "node_id": node,
        "seq": seq,
        "request_id": request_id,
        "trace_id": "0" * 31 + "1",
    }


def tokens(request_id: str, values: list[float], model: str = "m", route: str = "default",
           at: float = 1000.0, **kw: object) -> TokenEntropy:
    return TokenEntropy(**_common(request_id, at), model=model, route=route,
                        entropies=pack_entropies(values), **kw)


def audit(request_id: str, prompt: str = "q", response: str = "a", model: str = "m",
          route: str = "default", at: float = 1000.0, **kw: object) -> Audit:
    return Audit(**_common(request_id, at), audit_id=f"audit-{request_id}", model=model,
                 prompt=prompt, response=response, route=route, **kw)


def feedback(request_id: str, corrected: str = "", rating: int = 1, at: float = 1000.0,
             **kw: object) -> Feedback:
    return Feedback(**_common(request_id, at, node="gateway"), rating=rating,
                    corrected_answer=corrected, **kw)


def fallback(request_id: str, model: str = "m", route: str = "default", tier: str = "primary",
             at: float = 1000.0, **kw: object) -> Fallback:
    return Fallback(**_common(request_id, at, node="gateway"), model=model, reason="timeout",
                    route=route, from_tier=tier, **kw)


def bad_case(request_id: str, labels: list[str], confidence: float = 0.9, model: str = "m",
             adapter: str = "a1", at: float = 1000.0) -> BadCase:
    return BadCase(**_common(request_id, at), model=model, prompt="q", response="r",
                   correction="c", adapter=adapter, labels=labels, confidence=confidence)
