"""Seeded, hand-shaped records of every rolled-up type, for the sink tests (one place, short tests)."""

from __future__ import annotations

import random
import time

from entroloop.contract.ids import derived_event_id
from entroloop.contract.records import (
    Alert,
    Audit,
    BadCase,
    Event,
    Fallback,
    Feedback,
    IntentScore,
    Span,
    TokenEntropy,
    pack_entropies,
)

MODELS = ("qwen-7b", "llama-8b")
ROUTES = ("chat", "code")
NODES = ("node-a", "node-b")


def sample_records(requests: int, seed: int = 1, start: float | None = None, span_s: float = 300.0) -> dict[str, list[Event]]:
    """``requests`` requests spread over ``span_s`` seconds; topic -> records, in emit order."""
    rng = random.Random(seed)
    # recent by default: the raw tables' TTL (90 days) drops older rows as soon as they land
    start = float(int(time.time() // 3600 - 2) * 3600) if start is None else start
    out: dict[str, list[Event]] = {}

    def add(record: Event) -> None:
        out.setdefault(record.topic, []).append(record)

    for i in range(requests):
        at = start + rng.random() * span_s
        request_id = f"req-{seed}-{i:06d}"
        node = rng.choice(NODES)
        model, route = rng.choice(MODELS), rng.choice(ROUTES)

        def common(kind: str, seq_offset: int = 0) -> dict[str, object]:
            return {
                "event_id": derived_event_id(request_id, kind, at=at),
                "emitted_at": at,
                "node_id": node,
                "seq": i * 10 + seq_offset,
                "request_id": request_id,
                "trace_id": f"{i:032x}",
            }

        n_tokens = rng.randint(0, 40)
        entropies = [round(rng.uniform(0.0, 6.0), 2) for _ in range(n_tokens)]
        add(TokenEntropy(**common("tokens"), model=model, route=route, adapter=rng.choice(("", "lora-1")),
                         entropies=pack_entropies(entropies)))
        ttft, tpot = rng.uniform(0.02, 0.5), rng.uniform(0.005, 0.05)
        add(Span(**common("span", 1), span_id=f"{i:016x}", name="llm_request", start_time=at, end_time=at + 1,
                 model=model, route=route, status=rng.choice(("ok", "ok", "ok", "error")),
                 ttft_s=ttft, tpot_s=tpot, e2e_s=ttft + tpot * n_tokens, output_tokens=n_tokens,
                 prompt_tokens=rng.randint(1, 500)))
        if i % 3 == 0:  # a child span without latency fields: must not disturb the quantiles
            add(Span(**common("span-child", 2), span_id=f"c{i:015x}", name="tokenize", start_time=at,
                     end_time=at + 0.001, parent_span_id=f"{i:016x}", model=model, route=route))
        add(Audit(**common("audit", 3), audit_id=f"aud-{seed}-{i:06d}", model=model, route=route,
                  prompt=f"question {i}", response=f"answer {i} " * rng.randint(1, 5),
                  user_id=f"user-{i % 17}", tenant=rng.choice(("acme", "globex")),
                  prompt_template_version=rng.choice(("v1", "v2"))))
        add(IntentScore(**common("intent", 4), model=model, route=route, similarity=rng.uniform(0.1, 1.0),
                        language=rng.choice(("en", "de")), threshold=0.5))
        if rng.random() < 0.2:
            add(Fallback(**common("fallback", 5), model=model, route=route,
                         reason=rng.choice(("timeout", "low_confidence"))))
        if rng.random() < 0.1:
            add(Alert(**common("alert", 6), alert_key=f"loop/{request_id}", rule=rng.choice(("entropy_loop", "gibberish")),
                      model=model, route=route, subject_node=node, value=rng.uniform(0, 2), threshold=1.5))
        if rng.random() < 0.15:
            add(Feedback(**common("feedback", 7), rating=rng.choice((-1, 1)), user_id=f"user-{i % 17}",
                         error_type=rng.choice(("", "wrong_fact")),
                         corrected_answer=rng.choice(("", "fixed")), tenant=("acme", "globex", "")[i % 3]))
        if rng.random() < 0.1:
            add(BadCase(**common("badcase", 8), model=model, route=route, prompt="p", response="r",
                        correction="c", labels=["wrong_fact"], confidence=rng.uniform(0.5, 1.0)))
    return out
