"""The logprobs the gateway asks a non-vLLM engine for: read them as entropies, then give the client
only what it asked for (so it sees what the engine would have sent it)."""

from __future__ import annotations

import math
from typing import Any

from entroloop.collectors.gateway.topk_entropy import (
    chat_token_hashes,
    chat_token_logprobs,
    completion_token_hashes,
    completion_token_logprobs,
    token_measures,
)


def approximate_measures(path: str, data: dict[str, Any]) -> tuple[list[float], list[float] | None]:
    """Per-token entropy of the first choice from its top-k logprobs, and its sampled tokens'
    surprisals aligned with them (None when one token's own logprob is missing: the record then
    goes without), reading each token's logprobs once."""
    choices = data.get("choices") or []
    if not choices:
        return [], []
    logprobs = choices[0].get("logprobs")
    tokens = chat_token_logprobs(logprobs) if path.endswith("chat/completions") else completion_token_logprobs(logprobs)
    entropies, surprisals = token_measures(tokens)
    return entropies, None if any(math.isnan(v) for v in surprisals) else surprisals


def approximate_token_hashes(path: str, data: dict[str, Any]) -> list[int] | None:
    """Per-token hash of the first choice's sampled tokens, aligned with ``approximate_measures``
    (None when the engine's logprobs do not name every token: the record then goes without)."""
    choices = data.get("choices") or []
    if not choices:
        return []
    logprobs = choices[0].get("logprobs")
    return chat_token_hashes(logprobs) if path.endswith("chat/completions") else completion_token_hashes(logprobs)


def restore_client_logprobs(path: str, data: dict[str, Any], asked: int | None) -> None:
    """Give the client the logprobs it asked for and no more (none if it asked for none)."""
    for choice in data.get("choices") or []:
        logprobs = choice.get("logprobs")
        if asked is None or logprobs is None:
            choice["logprobs"] = None
        elif path.endswith("chat/completions"):
            for token in logprobs.get("content") or []:
                token["top_logprobs"] = (token.get("top_logprobs") or [])[:asked]
        else:
            logprobs["top_logprobs"] = [
                dict(sorted(top.items(), key=lambda kv: kv[1], reverse=True)[:asked]) if top else top
                for top in logprobs.get("top_logprobs") or []
            ]


__all__ = ["approximate_measures", "approximate_token_hashes", "restore_client_logprobs"]
