"""Approximate per-token entropy from the top-k logprobs an OpenAI-compatible engine returns.

Used only for engines without the entropy tap (``approximate=True`` on the TokenEntropy record). The
top-k probabilities are renormalised to sum to one and their Shannon entropy (nats) is taken; this is
what host-side practice computes, and what ``entroloop bench collector`` compares the exact tap with.
It under-estimates flat distributions (the tail mass is ignored), hence the flag.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterable, Mapping
from typing import Any

TOKEN_ID_PREFIX = "token_id:"
"""How vLLM names a token with ``return_tokens_as_token_ids``: then the hash is the id itself, as
the entropy tap ships it."""


def _log_mass(values: list[float]) -> float:
    top = max(values)
    # log-sum-exp around the maximum, so very negative logprobs do not underflow to a zero mass
    return top + math.log(sum(math.exp(v - top) for v in values))


def entropy_from_logprobs(logprobs: Iterable[float]) -> float:
    """Shannon entropy (nats) of the renormalised distribution over the given top-k logprobs."""
    values = [v for v in logprobs if v is not None and math.isfinite(v)]
    if not values:
        return float("nan")
    log_mass = _log_mass(values)
    return -sum(math.exp(v - log_mass) * (v - log_mass) for v in values)


def surprisal_from_logprobs(sampled: Any, logprobs: Iterable[float]) -> float:
    """The sampled token's surprisal (nats) under the same renormalised top-k distribution as
    ``entropy_from_logprobs``, so the two compare (gibberish: tokens that keep surprising the model
    more than its entropy expects). A token sampled from outside the top k keeps its own logprob,
    which is at most the top-k mass: the result is never negative. NaN without a usable logprob."""
    values = [v for v in logprobs if v is not None and math.isfinite(v)]
    if not values or not isinstance(sampled, (int, float)) or not math.isfinite(sampled):
        return float("nan")
    return max(0.0, _log_mass(values) - float(sampled))


def chat_token_logprobs(choice_logprobs: Mapping[str, Any] | None) -> list[tuple[Any, list[Any]]]:
    """(the sampled token's logprob, the top-k logprobs) per generated token of a chat choice, from
    ``logprobs.content[i]``; a token without ``top_logprobs`` stands alone in its top k."""
    if not choice_logprobs:
        return []
    out = []
    for token in choice_logprobs.get("content") or []:
        top = token.get("top_logprobs") or [{"logprob": token.get("logprob")}]
        out.append((token.get("logprob"), [t.get("logprob") for t in top]))
    return out


def completion_token_logprobs(choice_logprobs: Mapping[str, Any] | None) -> list[tuple[Any, list[Any]]]:
    """The same per generated token of a completion choice, from ``logprobs.top_logprobs[i]``
    ({token: logprob}) and ``logprobs.token_logprobs[i]``."""
    if not choice_logprobs:
        return []
    out = []
    tops = choice_logprobs.get("top_logprobs") or []
    sampled = choice_logprobs.get("token_logprobs") or []
    for i, top in enumerate(tops):
        own = sampled[i] if i < len(sampled) else None
        out.append((own, list(top.values()) if top else [own]))
    return out


def token_measures(tokens: Iterable[tuple[Any, list[Any]]]) -> tuple[list[float], list[float]]:
    """Per token, in one pass: the approximate entropy and the sampled token's surprisal (NaN where
    a token has no usable logprob)."""
    entropies, surprisals = [], []
    for sampled, top in tokens:
        entropies.append(entropy_from_logprobs(top))
        surprisals.append(surprisal_from_logprobs(sampled, top))
    return entropies, surprisals


def token_hash(token: Any, token_bytes: Any = None) -> int | None:
    """A 32-bit hash of one sampled token as an OpenAI-compatible engine names it, or None.

    ``token_id:N`` (vLLM's ``return_tokens_as_token_ids``) is the id N; otherwise CRC-32 of the
    token's bytes (the ``bytes`` field when given: two tokens that decode to the same text piece
    differently keep different hashes), else of its UTF-8 text. Only equality within one response
    matters (a detector looks for a token cycle repeating), so CRC-32 — one C call, 4 bytes — is
    enough: a collision can only join two different tokens, not split a real cycle."""
    if isinstance(token_bytes, list) and token_bytes and all(isinstance(b, int) and 0 <= b < 256 for b in token_bytes):
        return zlib.crc32(bytes(token_bytes))
    if not isinstance(token, str):
        return None
    if token.startswith(TOKEN_ID_PREFIX) and token[len(TOKEN_ID_PREFIX):].isdigit():
        return int(token[len(TOKEN_ID_PREFIX):]) % 2**32
    return zlib.crc32(token.encode("utf-8", "surrogatepass"))


def chat_token_hashes(choice_logprobs: Mapping[str, Any] | None) -> list[int] | None:
    """One hash per entry of a chat choice's ``logprobs.content`` (as its entropies), or None if any
    entry has no usable token."""
    if not choice_logprobs:
        return []
    out = []
    for token in choice_logprobs.get("content") or []:
        value = token_hash(token.get("token"), token.get("bytes")) if isinstance(token, Mapping) else None
        if value is None:
            return None
        out.append(value)
    return out


def completion_token_hashes(choice_logprobs: Mapping[str, Any] | None) -> list[int] | None:
    """One hash per entry of a completion choice's ``logprobs.tokens`` (aligned with its
    ``top_logprobs``), or None if the tokens are missing or do not line up."""
    if not choice_logprobs:
        return []
    tokens = choice_logprobs.get("tokens")
    tops = choice_logprobs.get("top_logprobs") or []
    if not isinstance(tokens, list) or len(tokens) != len(tops):
        return None
    out = []
    for token in tokens:
        value = token_hash(token)
        if value is None:
            return None
        out.append(value)
    return out


__all__ = [
    "TOKEN_ID_PREFIX",
    "chat_token_hashes",
    "chat_token_logprobs",
    "completion_token_hashes",
    "completion_token_logprobs",
    "entropy_from_logprobs",
    "surprisal_from_logprobs",
    "token_hash",
    "token_measures",
]
