"""A tiny OpenAI-compatible engine on 127.0.0.1 for the gateway tests (real sockets, real uvicorn).

Answers deterministically, echoes the last user message (so PII flows back through the response),
returns hand-computable top-k logprobs when asked, and records every request it received.
``vllm=True`` makes it answer ``/version`` like vLLM and list a LoRA adapter in ``/v1/models``.
Model names in ``missing`` are answered 404 like vLLM answers a LoRA adapter it has not loaded.
"""

from __future__ import annotations

import json
import math
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.unit.collectors.served_app import ServedApp

# Per generated token: the engine's top logprobs (as many as asked, up to these).
TOKENS = ["Hello", " there"]
TOP = [
    [("Hello", math.log(0.5)), ("Hi", math.log(0.25)), ("Hey", math.log(0.25))],
    [(" there", math.log(0.4)), (" you", math.log(0.4)), ("!", math.log(0.1)), (".", math.log(0.1))],
]


def _reply(body: dict[str, Any], chat: bool) -> str:
    if chat:
        last = body["messages"][-1]["content"]
    else:
        last = body["prompt"]
    return f"Hello there, {last}"


def _token_logprobs(body: dict[str, Any], i: int) -> dict[str, Any]:
    """Chat logprobs entry of generated token ``i`` with as many top logprobs as the body asks."""
    k = int(body.get("top_logprobs") or 0)
    tok = TOKENS[i]
    return {
        "token": tok,
        "logprob": TOP[i][0][1],
        "bytes": list(tok.encode()),
        "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(t.encode())} for t, lp in TOP[i][:k]],
    }


class FakeUpstream:
    def __init__(self, vllm: bool = False) -> None:
        self.vllm = vllm
        self.received: list[tuple[str, dict[str, Any], dict[str, str]]] = []
        self.missing: set[str] = set()
        app = Starlette(
            routes=[
                Route("/version", self.version),
                Route("/v1/models", self.models),
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/completions", self.completions, methods=["POST"]),
            ]
        )
        self._served = ServedApp(app, "fake upstream")
        self.port, self.url = self._served.port, self._served.url

    def __enter__(self) -> FakeUpstream:
        self._served.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._served.__exit__(*exc)

    async def version(self, request: Request) -> Response:
        if self.vllm:
            return JSONResponse({"version": "0.32.0"})
        return JSONResponse({"detail": "Not Found"}, 404)

    async def models(self, request: Request) -> Response:
        data = [{"id": "base-m", "object": "model", "parent": None}]
        if self.vllm:
            data.append({"id": "support-lora", "object": "model", "parent": "base-m"})
        return JSONResponse({"object": "list", "data": data})

    async def chat(self, request: Request) -> Response:
        body = await request.json()
        self.received.append(("/v1/chat/completions", body, dict(request.headers)))
        if body.get("model") in self.missing:
            return JSONResponse({"object": "error", "message": f"The model `{body['model']}` does not exist.",
                                 "type": "NotFoundError", "code": 404}, 404)
        text = _reply(body, chat=True)
        if body.get("stream"):
            return StreamingResponse(self._chat_stream(body, text), media_type="text/event-stream")
        logprobs = {"content": [_token_logprobs(body, i) for i in range(len(TOKENS))]} if body.get("logprobs") else None
        return JSONResponse(
            {
                "id": "chatcmpl-1",
                "object": "chat.completion",
                "created": 1700000000,
                "model": body["model"],
                "choices": [
                    {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": logprobs, "finish_reason": "stop"}
                ],
                "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11},
            }
        )

    async def _chat_stream(self, body: dict[str, Any], text: str):
        # one event per generated token ("Hello", then the rest), with its logprobs when asked
        for i, piece in enumerate((text[:5], text[5:])):
            logprobs = {"content": [_token_logprobs(body, i)]} if body.get("logprobs") else None
            choice = {"index": 0, "delta": {"content": piece}, "logprobs": logprobs, "finish_reason": None}
            chunk = {"id": "c", "object": "chat.completion.chunk", "choices": [choice]}
            yield f"data: {json.dumps(chunk)}\n\n".encode()
        yield b"data: [DONE]\n\n"

    async def completions(self, request: Request) -> Response:
        body = await request.json()
        self.received.append(("/v1/completions", body, dict(request.headers)))
        k = body.get("logprobs")
        logprobs = None
        if k:
            logprobs = {
                "tokens": TOKENS,
                "token_logprobs": [TOP[i][0][1] for i in range(2)],
                "top_logprobs": [dict(TOP[i][:k]) for i in range(2)],
                "text_offset": [0, 5],
            }
        return JSONResponse(
            {
                "id": "cmpl-1",
                "object": "text_completion",
                "created": 1700000000,
                "model": body["model"],
                "choices": [{"index": 0, "text": _reply(body, chat=False), "logprobs": logprobs, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 4, "completion_tokens": 2, "total_tokens": 6},
            }
        )
