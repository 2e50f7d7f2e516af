"""Quick events/s of each stream-analytics processor on one core (a timing script, not a test).

Usage (pin to one core so the figure is per core):
    taskset -c 0 .venv/bin/python scripts/time_stream_processors.py [--events N] [--json]
    taskset -c 0 .venv-ml/bin/python scripts/time_stream_processors.py --intent-real   # MiniLM

Inputs are synthetic but shaped like the fleet's: 256-token entropy arrays, Chinese and English
answers with amounts and dates, 5 % fallbacks, corrections on 2 % of requests. The figure is
input records processed per second of wall time, watermarks included, in batches of 500.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from entroloop.streams.bad_cases import BadCaseJoiner  # noqa: E402
from entroloop.streams.base import Processor  # noqa: E402
from entroloop.streams.entropy_baseline import EntropyBaselineDetector  # noqa: E402
from entroloop.streams.fallback_rates import FallbackRateMonitor  # noqa: E402
from entroloop.streams.intent_similarity import IntentSimilarityScorer  # noqa: E402
from entroloop.streams.response_rules import ResponseRuleChecker  # noqa: E402
from entroloop.streams.retrain_triggers import RetrainTrigger  # noqa: E402

from entroloop.contract.ids import derived_event_id  # noqa: E402
from entroloop.contract.records import (  # noqa: E402
    Audit,
    BadCase,
    Event,
    Fallback,
    Feedback,
    TokenEntropy,
    pack_entropies,
)

T0 = 1_800_000_000.0
RATE = 5000.0  # requests per second of event time
RESPONSES = [
    "您的账户余额为{n}.00元，到期日2024-03-05。如有疑问请联系客服。",
    "手续费为{n}元，将于2024年3月6日扣除。",
    "The order total is {n}.50 USD and ships within 3 days.",
    "每袋重量为{n}克，保质期12个月。",
    '{{"amount": {n}, "currency": "CNY"}}',
]


def _common(i: int, node: str = "node-1") -> dict[str, object]:
    at = T0 + i / RATE
    return {
        "event_id": derived_event_id("bench", node, i, at=at),
        "emitted_at": at,
        "node_id": node,
        "seq": i,
        "request_id": f"req-{i}",
    }


def audits(n: int) -> list[Audit]:
    return [
        Audit(
            **_common(i),
            audit_id=f"a{i}",
            model=f"model-{i % 3}",
            prompt=f"问题 {i % 400}: 我的余额是多少？",
            response=RESPONSES[i % len(RESPONSES)].format(n=100 + i % 97),
            route="chat" if i % 4 else "json",
            adapter="lora-1",
        )
        for i in range(n)
    ]


def token_entropies(n: int) -> list[TokenEntropy]:
    rng = np.random.default_rng(0)
    return [
        TokenEntropy(
            **_common(i),
            model=f"model-{i % 3}",
            entropies=pack_entropies(rng.gamma(2.0, 0.6 + 0.3 * (i % 3), 256)),
        )
        for i in range(n)
    ]


def audits_and_fallbacks(n: int) -> list[Event]:
    out: list[Event] = []
    for a in audits(n):
        out.append(a)
        if a.seq % 20 == 0:
            out.append(Fallback(**_common(a.seq, "gateway"), model=a.model, reason="timeout", route=a.route))
    return out[:n]


def audits_and_feedback(n: int) -> list[Event]:
    out: list[Event] = []
    for a in audits(n):
        out.append(a)
        if a.seq % 50 == 0:
            out.append(
                Feedback(**_common(a.seq, "gateway"), rating=1, corrected_answer=a.response.replace("2024", "2025"))
            )
    return out[:n]


def audits_and_bad_cases(n: int) -> list[Event]:
    out: list[Event] = []
    for a in audits(n):
        out.append(a)
        if a.seq % 30 == 0:
            out.append(
                BadCase(
                    **_common(a.seq, "bad_cases"),
                    model=a.model,
                    prompt=a.prompt,
                    response=a.response,
                    correction="x",
                    adapter=a.adapter,
                    labels=["number", "date"][a.seq % 2 :][:1],
                    confidence=0.9,
                )
            )
    return out[:n]


class HashEmbedder:
    """Stand-in embedder (fixed cost, no model) to time the scorer's own overhead."""

    name = "hash"

    def embed(self, texts: list[str]) -> np.ndarray:
        rows = np.stack([np.frombuffer(bytes(32 * [hash(t) & 0xFF]), dtype=np.uint8) for t in texts]).astype(np.float32) + 1
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def time_processor(processor: Processor, records: Sequence[Event], batch: int = 500) -> tuple[float, float]:
    """(events per wall second, events per CPU second of this process).

    On a shared machine the wall figure understates a core's capacity; the CPU-time figure is
    what one dedicated core would do (all timed work is single-threaded).
    """
    start, cpu_start = time.perf_counter(), time.process_time()
    for i in range(0, len(records), batch):
        chunk = records[i : i + batch]
        processor.process_batch(chunk)
        processor.on_watermark(chunk[-1].emitted_at)
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    return len(records) / elapsed, len(records) / cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=50_000)
    parser.add_argument("--intent-real", action="store_true", help="time the real MiniLM embedder (.venv-ml)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    n = args.events
    cases: list[tuple[str, Callable[[], Processor], Callable[[int], Sequence[Event]], int]] = [
        ("entropy_baseline", EntropyBaselineDetector, token_entropies, n),
        ("fallback_rates", FallbackRateMonitor, audits_and_fallbacks, n),
        ("response_rules", ResponseRuleChecker, audits, n),
        ("bad_cases", BadCaseJoiner, audits_and_feedback, n),
        ("retrain_triggers", RetrainTrigger, audits_and_bad_cases, n),
        ("intent_similarity[hash-embedder]", lambda: IntentSimilarityScorer(HashEmbedder()), audits, n // 5),
    ]
    if args.intent_real:
        import torch
        from entroloop.streams.intent_similarity import SentenceTransformerEmbedder

        torch.set_num_threads(1)
        os.environ["HF_HUB_OFFLINE"] = "1"
        embedder = SentenceTransformerEmbedder(batch_size=64)
        embedder.embed(["warm up"])
        cases = [("intent_similarity[all-MiniLM-L6-v2]", lambda: IntentSimilarityScorer(embedder), audits, 2000)]
    results = {}
    for name, make, build, count in cases:
        records = build(count)
        wall, cpu = time_processor(make(), records)
        results[name] = {"events_per_s_wall": round(wall), "events_per_cpu_s": round(cpu)}
        if not args.json:
            print(f"{name:40s} {wall:10,.0f} events/s wall {cpu:10,.0f} events/CPU-s  ({len(records)} events)")
    if args.json:
        print(json.dumps(results))


if __name__ == "__main__":
    main()
