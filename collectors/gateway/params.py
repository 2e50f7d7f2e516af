"""Checking a completion request's body before the gateway uses it: 400 with a message, never a 500.

The gateway reads some parameters itself (``logprobs``/``top_logprobs`` to ask a non-vLLM engine for
top-k, ``stream``, ``messages``/``prompt`` for the audit); a ``top_logprobs: "abc"`` used to end in
``int("abc")`` and a 500 with a traceback. Every parameter the gateway or the audit reads is
checked here with pydantic in strict mode (no ``"5"`` for 5, no ``true`` for 1, no NaN), and the
first problem comes back in OpenAI's error shape, naming the parameter. Parameters the gateway does
not know pass through untouched: the engine judges those.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError


class _Common(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow", allow_inf_nan=False)

    model: str | None = None
    max_tokens: int | None = Field(None, ge=0)
    max_completion_tokens: int | None = Field(None, ge=0)
    n: int | None = Field(None, ge=1)
    temperature: float | None = Field(None, ge=0)
    top_p: float | None = Field(None, gt=0, le=1)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0, le=1)
    seed: int | None = None
    presence_penalty: float | None = Field(None, ge=-2, le=2)
    frequency_penalty: float | None = Field(None, ge=-2, le=2)
    repetition_penalty: float | None = Field(None, gt=0)
    stream: bool | None = None
    stream_options: dict[str, Any] | None = None
    stop: str | list[str] | None = None
    user: str | None = None
    vllm_xargs: dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None


class ChatRequest(_Common):
    messages: list[dict[str, Any]] = Field(min_length=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(None, ge=0)


class CompletionRequest(_Common):
    prompt: str | list[str] | list[int] | list[list[int]]
    logprobs: int | None = Field(None, ge=0)
    echo: bool | None = None
    best_of: int | None = Field(None, ge=1)


class InvalidRequest(Exception):
    """A body the gateway refuses; ``param`` names the parameter (or is None)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.param = param

    def as_openai_error(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": "invalid_request_error", "param": self.param, "code": None}}


MAX_JSON_DEPTH = 64  # deeper bodies could not be redacted (recursion) and so never audited


def _check_tree(body: Any) -> None:
    """Refuse what the audit could not record: nesting over ``MAX_JSON_DEPTH``, strings that are not
    valid Unicode (a lone surrogate ``\\ud800`` parses, then fails every UTF-8 encode)."""
    stack = [(body, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise InvalidRequest("the request body holds a string that is not valid Unicode (a lone surrogate)") from None
        elif isinstance(value, dict | list):
            if depth > MAX_JSON_DEPTH:
                raise InvalidRequest(f"the request body is nested deeper than {MAX_JSON_DEPTH} levels")
            items = [*value.keys(), *value.values()] if isinstance(value, dict) else value
            stack.extend((item, depth + 1) for item in items)


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


def parse_body(raw: bytes, path: str) -> dict[str, Any]:
    """The request body as a dict, checked; ``InvalidRequest`` says what is wrong."""
    try:
        body = json.loads(raw, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise InvalidRequest(f"the request body is not valid JSON: {exc}"[:300]) from None
    if not isinstance(body, dict):
        raise InvalidRequest("the request body must be a JSON object")
    _check_tree(body)
    schema = ChatRequest if path.endswith("chat/completions") else CompletionRequest
    try:
        schema.model_validate(body)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        param = ".".join(str(part) for part in first["loc"]) or None
        got = json.dumps(first.get("input"), ensure_ascii=False, default=str)
        got = got if len(got) <= 60 else got[:57] + "..."
        detail = "is required" if first["type"] == "missing" else f"{first['msg'][0].lower()}{first['msg'][1:]} (got {got})"
        raise InvalidRequest(f"{param}: {detail}", param.split(".")[0] if param else None) from None
    return body


__all__ = ["ChatRequest", "CompletionRequest", "InvalidRequest", "parse_body"]
