"""From an OpenAI-API request and response to the redacted text and parameters an Audit record holds.

PII redaction happens here, on every string of the prompt and the response, before any record is
built: nothing that leaves the gateway carries a raw e-mail, phone number, card or ID number or IP
address (``entroloop.infra.pii``). User ids become keyed pseudonyms.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from entroloop.infra.pii import PiiRedactor

# Request fields that decide what the engine generates: kept (as scalars) to reproduce the answer.
SAMPLING_KEYS = (
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "max_tokens",
    "max_completion_tokens",
    "n",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "stop",
    "logprobs",
    "top_logprobs",
    "stream",
    "response_format",
)


@dataclass
class RedactedExchange:
    """The redacted text of one request (prompt, response, sampling values, prompt version), with
    entity counts over all of it: the Audit's ``redactions`` must count every entity it replaced."""

    prompt: str
    response: str
    counts: dict[str, int] = field(default_factory=dict)
    sampling: dict[str, Any] = field(default_factory=dict)
    prompt_version: str = ""


def _redact_tree(value: Any, redactor: PiiRedactor, counts: Counter[str]) -> Any:
    """Every string in a JSON tree redacted (message contents, multi-part text, names)."""
    if isinstance(value, str):
        result = redactor.redact(value)
        counts.update(result.counts)
        return result.text
    if isinstance(value, list):
        return [_redact_tree(v, redactor, counts) for v in value]
    if isinstance(value, dict):
        return {_redact_tree(k, redactor, counts): _redact_tree(v, redactor, counts) for k, v in value.items()}
    return value


def _as_text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def prompt_of(path: str, body: Mapping[str, Any]) -> Any:
    """Chat: the ``messages`` list; completions: ``prompt`` (string, list or token ids)."""
    return body.get("messages", []) if path.endswith("chat/completions") else body.get("prompt", "")


def message_text(message: Mapping[str, Any]) -> str:
    """What an assistant message said, as the audit keeps it: its content, then its tool calls as
    compact JSON when it made any (a tool call is what the model did; an audit without it would
    not say which function it called with which arguments)."""
    content = message.get("content") or ""
    content = content if isinstance(content, str) else _as_text(content)
    calls = message.get("tool_calls") or []
    if not calls:
        return content
    return f"{content}\n{_as_text(calls)}" if content else _as_text(calls)


def response_texts(path: str, response: Mapping[str, Any]) -> list[str]:
    """The generated text of every choice."""
    texts = []
    for choice in response.get("choices") or []:
        if path.endswith("chat/completions"):
            texts.append(message_text(choice.get("message") or {}))
        else:
            texts.append(choice.get("text") or "")
    return texts


def redact_exchange(prompt: Any, texts: list[str], redactor: PiiRedactor, *,
                    sampling: Mapping[str, Any] | None = None, prompt_version: str = "") -> RedactedExchange:
    """Redact prompt, response, the string sampling values (``stop``, ``response_format`` as JSON, ...)
    and the prompt-version header; one choice is kept as its text, several as a JSON list."""
    counts: Counter[str] = Counter()
    redacted_prompt = _as_text(_redact_tree(prompt, redactor, counts))
    redacted_texts = _redact_tree(texts, redactor, counts)
    response = redacted_texts[0] if len(redacted_texts) == 1 else _as_text(redacted_texts)
    redacted_sampling = {key: _redact_tree(value, redactor, counts) for key, value in (sampling or {}).items()}
    redacted_version = _redact_tree(prompt_version, redactor, counts)
    return RedactedExchange(redacted_prompt, response, dict(counts), redacted_sampling, redacted_version)


def sampling_of(body: Mapping[str, Any]) -> dict[str, str | int | float | bool | None]:
    """The sampling parameters the client sent, as scalars (lists and objects as compact JSON)."""
    out: dict[str, str | int | float | bool | None] = {}
    for key in SAMPLING_KEYS:
        if key in body:
            value = body[key]
            out[key] = value if isinstance(value, str | int | float | bool) or value is None else _as_text(value)
    return out


def user_of(body: Mapping[str, Any], headers: Mapping[str, str]) -> str:
    """The raw user identity (the OpenAI ``user`` field, else ``X-User-Id``); pseudonymise before use."""
    return str(body.get("user") or headers.get("x-user-id") or "")


__all__ = [
    "SAMPLING_KEYS", "RedactedExchange", "message_text", "prompt_of", "redact_exchange", "response_texts", "sampling_of",
    "user_of",
]
