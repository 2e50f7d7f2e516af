"""The common-practice baseline of `entroloop bench collector`: entropy from top-k logprobs."""

from __future__ import annotations

import math
from types import SimpleNamespace

from collectors.vllm.bench import topk_entropy


def logprobs(probs: list[float]) -> dict[int, SimpleNamespace]:
    return {i: SimpleNamespace(logprob=math.log(p)) for i, p in enumerate(probs)}


def test_topk_entropy_is_exact_when_k_covers_the_distribution() -> None:
    probs = [0.5, 0.25, 0.25]
    assert math.isclose(topk_entropy(logprobs(probs)), -sum(p * math.log(p) for p in probs))


def test_topk_entropy_underestimates_flat_distributions() -> None:
    """20 of 1000 equally likely tokens: truly log(1000) nats, top-20 says log(20)."""
    flat = logprobs([1 / 1000] * 20)
    assert math.isclose(topk_entropy(flat), math.log(20))
    assert math.log(1000) - topk_entropy(flat) > 3.9
