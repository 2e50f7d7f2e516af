"""A synthetic serving fleet: what several vLLM nodes and a gateway would emit, with ground truth.

Used by the demo, the tests and the benchmarks. Each request yields the records a real node
emits (audit, token entropy, a request span; sometimes feedback and a fallback) plus labels that
say which pathologies were injected where, so detectors can be scored.

Entropy statistics follow the product brief: normal tokens mostly within 2.1-3.8 nats (an AR(1)
process around a per-model level, with brief natural dips to near-certain tokens and isolated
spikes, as real generations have), repetition loops as long runs below 1.5 nats, gibberish as runs
above 4.5 nats. Lengths are long-tailed (log-normal). Prompts are Chinese and English.

Every TokenEntropy record also carries the sampled token ids (``token_hashes``), as the entropy tap
sends them, so the evidence rules (streams/entropy_evidence.py) can judge the fleet as they judge
real traffic:

- a loop is what a model stuck in one does: a cycle of 1-8 token ids repeated for at least
  ``LOOP_MIN_TOKENS`` tokens, each position of the cycle with (nearly) the same low entropy every
  time round, since the same context gives the same distribution;
- gibberish is near-uniform sampling over a large part of a ~150k vocabulary: 7-11 nats, sustained
  for at least ``GIBBERISH_MIN_TOKENS`` tokens (a few uncertain tokens are a name, not gibberish);
- normal text samples ids without short cycles.

The ids, the cycles and the jitter come from a second random stream (``token_rng``): the main
stream makes exactly the draws it made before ids existed, so lengths, models, routes, feedback and
every other label of a seeded fleet are unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import numpy as np

from entroloop.contract.ids import NodeStamper, new_span_id, new_trace_id, uuid7
from entroloop.contract.records import (
    Audit,
    Event,
    Fallback,
    Feedback,
    Span,
    TokenEntropy,
    pack_entropies,
    pack_token_hashes,
)

VOCAB = 151_646
"""Token ids are drawn below this (a Qwen2-sized vocabulary)."""
LOOP_MIN_TOKENS = 24
"""Shortest injected loop: the evidence's entropy-only minimum (``Settings.loop_min_tokens_entropy_only``),
so a loop is one with or without its ids; 3 turns of the longest cycle (8)."""
LOOP_MAX_PERIOD = 8
GIBBERISH_MIN_TOKENS = 20
"""Shortest injected gibberish: one rolling-median window (``Settings.entropy_band_window``)."""
GIBBERISH_SHIFT_NATS = 2.4
"""Added to the main stream's gibberish draws (N(5.6, 0.45) clipped to 4.6-9.0): 7.0-11.4 nats."""

# (language, prompt template, answer template, correct-format answer used as the user's correction)
# The {amount} answers carry the brief's currency format: two decimals and the unit.
TEMPLATES: list[tuple[str, str, str]] = [
    ("en", "What is the refund amount for order {n}?", "The refund for order {n} is {amount:.2f} USD."),
    ("en", "When will order {n} be delivered?", "Order {n} will be delivered on 2026-{m:02d}-{d:02d}."),
    ("en", "How do I reset the password of account {n}?", "Open Settings, choose Security, then Reset password for account {n}."),
    ("en", "Summarise the status of ticket {n}.", "Ticket {n} is resolved; the customer confirmed the fix."),
    ("en", "What is the monthly fee of plan {n}?", "Plan {n} costs {amount:.2f} USD per month."),
    ("zh", "订单{n}的退款金额是多少？", "订单{n}的退款金额为{amount:.2f}元。"),
    ("zh", "订单{n}什么时候送达？", "订单{n}预计于2026年{m}月{d}日送达。"),
    ("zh", "如何重置账户{n}的密码？", "打开设置，选择安全，然后为账户{n}重置密码。"),
    ("zh", "请总结工单{n}的处理情况。", "工单{n}已解决，客户已确认修复。"),
    ("zh", "套餐{n}的月费是多少？", "套餐{n}的月费为{amount:.2f}元。"),
]

PATHOLOGIES = ("repetition_loop", "gibberish", "off_intent", "format_error", "fallback")


@dataclass(frozen=True)
class FleetConfig:
    nodes: int = 4
    models: tuple[str, ...] = ("qwen2-7b-instruct", "llama3-8b-instruct", "glm4-9b-chat")
    routes: tuple[str, ...] = ("support", "billing", "search")
    # per-request probabilities of each injected pathology
    loop_rate: float = 0.04
    gibberish_rate: float = 0.03
    off_intent_rate: float = 0.05
    format_error_rate: float = 0.04
    fallback_rate: float = 0.03
    feedback_rate: float = 0.10
    correction_rate: float = 0.6
    """Share of off-intent and format-error answers whose user sends a corrected answer."""
    median_tokens: float = 120.0
    max_tokens: int = 8192
    chunk_tokens: int = 4096
    """Generations longer than this ship their entropies in several chunks."""


@dataclass
class Labels:
    """Ground truth for one request: which pathologies were injected and where."""

    request_id: str
    model: str
    route: str
    language: str
    n_tokens: int
    loops: list[tuple[int, int]] = field(default_factory=list)
    gibberish: list[tuple[int, int]] = field(default_factory=list)
    off_intent: bool = False
    format_error: bool = False
    error_label: str = ""
    """The bad-case label a correction of this answer must get (empty: no injected error)."""
    corrected: bool = False
    fallback: bool = False


@dataclass
class FleetRequest:
    records: list[Event]
    labels: Labels


# The fleet's traffic used to start on a fixed day (2026-11-30 00:53:20 UTC). Readers refuse events
# older than ENTROLOOP_EVENT_MAX_AGE_DAYS (the raw tables' TTL would drop them silently), so a fixed
# day would turn every fleet record into a dead letter 90 days later. The default start is that
# time of day (00:53:20 UTC), two days ago: recent, in the past, the same for every fleet made on one UTC day
# (processes that regenerate a seeded fleet agree), and aligned to minutes as before.
_TIME_OF_DAY_S = 1_796_000_000 % 86_400


def default_start_time(now: float | None = None) -> float:
    """Where a fleet's clock starts unless told: today's date (UTC) minus two days, at 00:53:20."""
    today = int((time.time() if now is None else now) // 86_400) * 86_400
    return float(today - 2 * 86_400 + _TIME_OF_DAY_S)


class SyntheticFleet:
    def __init__(self, seed: int = 7, config: FleetConfig | None = None, start_time: float | None = None) -> None:
        self.config = config or FleetConfig()
        self.rng = np.random.default_rng(seed)
        self.token_rng = np.random.default_rng([seed, 1])  # ids and cycles: see the module docstring
        self.nodes = [NodeStamper(f"node-{i}") for i in range(self.config.nodes)]
        self.gateway = NodeStamper("gateway-0")
        self.clock = start_time if start_time is not None else default_start_time()
        # each model has its own normal entropy level: adaptive baselines must learn it
        self.model_level = {m: 2.75 + 0.15 * i for i, m in enumerate(self.config.models)}

    # --- entropies -------------------------------------------------------------------------------
    def normal_entropies(self, n: int, level: float) -> np.ndarray:
        rng = self.rng
        noise = rng.normal(0.0, 0.26, n)
        values = np.empty(n, dtype=np.float64)
        x = 0.0
        for i in range(n):  # AR(1): neighbouring tokens have related uncertainty
            x = 0.6 * x + noise[i]
            values[i] = level + x
        # natural dips (1-3 near-certain tokens: punctuation, names) and isolated spikes
        # separated by at least 2 normal tokens: real near-certain stretches are short
        last_end = -3
        for start in np.flatnonzero(rng.random(n) < 0.03):
            if start < last_end + 2:
                continue
            last_end = start + int(rng.integers(1, 4))
            values[start:last_end] = rng.uniform(0.05, 1.3, len(values[start:last_end]))
        spikes = np.flatnonzero(rng.random(n) < 0.008)
        values[spikes] = rng.uniform(4.6, 5.6, spikes.size)
        return np.clip(values, 0.01, 7.0)

    def normal_ids(self, n: int) -> np.ndarray:
        """Sampled ids of normal text: no short cycles (a repeat at lag <= 12 is a ~1e-4 event)."""
        return self.token_rng.integers(0, VOCAB, n)

    def _inject_run(self, values: np.ndarray, ids: np.ndarray, low: bool) -> tuple[int, int]:
        n = len(values)
        # The main stream's draws, exactly as before ids existed (see the module docstring) ...
        drawn_length = int(min(n - 1, self.rng.integers(12, 160) if low else self.rng.integers(8, 60)))
        drawn_start = int(self.rng.integers(0, max(1, n - drawn_length)))
        if low:
            drawn = self.rng.uniform(0.02, 1.2, drawn_length)
        else:
            drawn = np.clip(self.rng.normal(5.6, 0.45, drawn_length), 4.6, 9.0) + GIBBERISH_SHIFT_NATS
        edge_values = [float(self.rng.uniform(2.4, 3.4)) for edge in (drawn_start - 1, drawn_start + drawn_length)
                       if 0 <= edge < n]
        # ... then the run as the evidence defines it: long enough, and for a loop a real cycle.
        length = min(n, max(drawn_length, LOOP_MIN_TOKENS if low else GIBBERISH_MIN_TOKENS))
        start = min(drawn_start, n - length)
        if low:  # a loop: a cycle of ids, each position nearly as certain every time round
            period = int(self.token_rng.integers(1, min(LOOP_MAX_PERIOD, length // 3) + 1))
            cycle_ids = self.token_rng.integers(0, VOCAB, period)
            cycle = drawn[:period]
            jitter = self.token_rng.normal(0.0, 0.01, length)
            values[start : start + length] = np.clip(np.resize(cycle, length) + jitter, 0.01, 1.3)
            ids[start : start + length] = np.resize(cycle_ids, length)
        else:  # gibberish: close to uniform over a large part of the vocabulary
            values[start : start + length] = np.resize(drawn, length)
            ids[start : start + length] = self.token_rng.integers(0, VOCAB, length)
        # keep the tokens around the injected run normal so the labelled span is the run itself
        for edge, value in zip([e for e in (start - 1, start + length) if 0 <= e < n], edge_values + [2.9, 2.9]):
            values[edge] = value
        return start, start + length

    # --- requests --------------------------------------------------------------------------------
    def requests(self, count: int) -> Iterator[FleetRequest]:
        for _ in range(count):
            yield self.request()

    def request(self) -> FleetRequest:
        cfg, rng = self.config, self.rng
        self.clock += float(rng.exponential(0.05))
        node = self.nodes[int(rng.integers(0, len(self.nodes)))]
        model = cfg.models[int(rng.integers(0, len(cfg.models)))]
        route = cfg.routes[int(rng.integers(0, len(cfg.routes)))]
        language, prompt_t, answer_t = TEMPLATES[int(rng.integers(0, len(TEMPLATES)))]
        params = {
            "n": int(rng.integers(10000, 99999)),
            "amount": float(rng.integers(100, 500000)) / 100,
            "m": int(rng.integers(1, 13)),
            "d": int(rng.integers(1, 29)),
        }
        prompt = prompt_t.format(**params)
        correct = answer_t.format(**params)
        request_id = uuid7(self.clock)
        trace_id = new_trace_id()
        n_tokens = int(min(cfg.max_tokens, max(8, rng.lognormal(np.log(cfg.median_tokens), 0.9))))
        labels = Labels(request_id, model, route, language, n_tokens)

        values = self.normal_entropies(n_tokens, self.model_level[model])
        ids = self.normal_ids(n_tokens)
        if rng.random() < cfg.loop_rate and n_tokens >= 16:
            labels.loops.append(self._inject_run(values, ids, low=True))
        elif rng.random() < cfg.gibberish_rate and n_tokens >= 12:
            labels.gibberish.append(self._inject_run(values, ids, low=False))

        response = correct
        if rng.random() < cfg.off_intent_rate:
            labels.off_intent = True
            labels.error_label = "off_intent"
            other = TEMPLATES[(TEMPLATES.index((language, prompt_t, answer_t)) + 2) % len(TEMPLATES)]
            response = other[2].format(**params)
        elif "{amount" in answer_t and rng.random() < cfg.format_error_rate * 2.5:
            # zh: the amount keeps 元 but loses its two decimals (the brief's currency format);
            # en: the amount is rounded to a whole number (a number error: the value changed)
            labels.format_error = True
            labels.error_label = "amount_format" if language == "zh" else "number"
            wrong_amount = f"{params['amount']:.1f}" if language == "zh" else f"{round(params['amount'])}"
            response = correct.replace(f"{params['amount']:.2f}", wrong_amount)

        stamp = lambda: node.stamp(self.clock)  # noqa: E731 - one node's clock for all its records
        records: list[Event] = []
        sampling = {"temperature": 0.7, "top_p": 0.9, "max_tokens": cfg.max_tokens}
        records.append(
            Audit(
                **stamp(), request_id=request_id, trace_id=trace_id, audit_id=uuid7(self.clock),
                model=model, route=route, prompt=prompt, response=response,
                tenant=f"tenant-{int(rng.integers(0, 5))}", user_id=f"u_{int(rng.integers(0, 400)):04d}",
                prompt_template_version=f"{route}-v{1 + int(rng.integers(0, 3))}",
                sampling=sampling, tokenizer_digest="sha256:synthetic", engine_version="vllm-synthetic",
                language=language,
            )
        )
        for chunk, first in enumerate(range(0, n_tokens, cfg.chunk_tokens)):
            part = values[first : first + cfg.chunk_tokens]
            records.append(
                TokenEntropy(
                    **stamp(), request_id=request_id, trace_id=trace_id, model=model, route=route,
                    entropies=pack_entropies(part), token_hashes=pack_token_hashes(ids[first : first + cfg.chunk_tokens]),
                    chunk_index=chunk, first_token_index=first,
                    final=first + cfg.chunk_tokens >= n_tokens,
                )
            )
        queue = float(rng.exponential(0.02))
        prefill = 0.002 * len(prompt) + float(rng.exponential(0.01))
        tpot = float(rng.lognormal(np.log(0.02), 0.25))
        decode = tpot * n_tokens
        records.append(
            Span(
                **stamp(), request_id=request_id, trace_id=trace_id, span_id=new_span_id(),
                name="llm_request", start_time=self.clock, end_time=self.clock + queue + prefill + decode,
                model=model, route=route, queue_s=queue, prefill_s=prefill, decode_s=decode,
                ttft_s=queue + prefill + tpot, tpot_s=tpot, e2e_s=queue + prefill + decode,
                prompt_tokens=max(1, len(prompt) // 3), output_tokens=n_tokens,
            )
        )
        if rng.random() < cfg.fallback_rate:
            labels.fallback = True
            records.append(
                Fallback(
                    **self.gateway.stamp(self.clock), request_id=request_id, trace_id=trace_id,
                    model=model, route=route, reason=str(rng.choice(["timeout", "rate_limited", "error_5xx"])),
                )
            )
        wrong = labels.off_intent or labels.format_error
        if wrong and rng.random() < cfg.correction_rate:
            labels.corrected = True
            records.append(
                Feedback(
                    **self.gateway.stamp(self.clock), request_id=request_id, trace_id=trace_id,
                    rating=-1, user_id=records[0].user_id,
                    error_type="off_intent" if labels.off_intent else "format",
                    corrected_answer=correct,
                )
            )
        elif rng.random() < cfg.feedback_rate:
            records.append(
                Feedback(
                    **self.gateway.stamp(self.clock), request_id=request_id, trace_id=trace_id,
                    rating=1 if not (wrong or labels.loops or labels.gibberish) else -1,
                    user_id=records[0].user_id,
                )
            )
        return FleetRequest(records, labels)


def malformed_payloads(rng: np.random.Generator, valid: bytes) -> list[tuple[str, bytes]]:
    """Poison inputs a real topic sees, each with the error type the consumer must report."""
    import msgspec

    decoded = msgspec.msgpack.decode(valid)
    future = dict(decoded, schema_version=99)
    nan = dict(decoded, entropies=pack_entropies([2.0, float("nan"), 3.0]), token_hashes=b"") if "entropies" in decoded else None
    payloads = [
        ("malformed", valid[: max(1, len(valid) // 2)]),
        ("malformed", bytes(rng.integers(0, 256, 64, dtype=np.uint8))),
        ("unsupported_schema_version", msgspec.msgpack.encode(future)),
    ]
    if nan is not None:
        payloads.append(("malformed", msgspec.msgpack.encode(nan)))
    return payloads
