"""Approximate per-token entropy from the top-k logprobs an OpenAI-compatible engine returns.

Used only for engines without the entropy tap (``approximate=True`` on the TokenEntropy record). The
top-k probabilities are renormalised to sum to one and their Shannon entropy (nats) is taken; this is
what host-side practice computes, and what ``entroloop bench collector`` compares the exact tap with.
It under-estimates flat distributions (the tail mass is ignored), hence the flag.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any


def entropy_from_logprobs(logprobs: Iterable[float]) -> float:
    """Shannon entropy (nats) of the renormalised distribution over the given top-k logprobs."""
    values = [v for v in logprobs if v is not None and math.isfinite(v)]
    if not values:
        return float("nan")
    top = max(values)
    # log-sum-exp around the maximum, so very negative logprobs do not underflow to a zero mass
    log_mass = top + math.log(sum(math.exp(v - top) for v in values))
    return -sum(math.exp(v - log_mass) * (v - log_mass) for v in values)


def chat_token_entropies(choice_logprobs: Mapping[str, Any] | None) -> list[float]:
    """Per generated token, from a chat choice's ``logprobs.content[i].top_logprobs``."""
    if not choice_logprobs:
        return []
    out = []
    for token in choice_logprobs.get("content") or []:
        top = token.get("top_logprobs") or [{"logprob": token.get("logprob")}]
        out.append(entropy_from_logprobs(t.get("logprob") for t in top))
    return out


def completion_token_entropies(choice_logprobs: Mapping[str, Any] | None) -> list[float]:
    """Per generated token, from a completion choice's ``logprobs.top_logprobs[i]`` ({token: logprob})."""
    if not choice_logprobs:
        return []
    out = []
    tops = choice_logprobs.get("top_logprobs") or []
    sampled = choice_logprobs.get("token_logprobs") or []
    for i, top in enumerate(tops):
        values = list(top.values()) if top else [sampled[i] if i < len(sampled) else None]
        out.append(entropy_from_logprobs(values))
    return out


__all__ = ["chat_token_entropies", "completion_token_entropies", "entropy_from_logprobs"]
