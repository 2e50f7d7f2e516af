"""Tool calls are part of what the model said: audited, streamed or not, the same way.

Before, a streamed answer's tool-call deltas were not collected (the Audit of a streamed tool-call
answer had an empty response), and an unstreamed message with both content and tool calls was
audited with its content alone. Driven through the gateway app against an engine that answers the
same tool call once as JSON and once as an SSE stream in pieces, as vLLM and OpenAI do.
"""

from __future__ import annotations

import json

import pytest
from entroloop.collectors.gateway.app import GatewayConfig, create_app
from entroloop.collectors.gateway.capture import message_text
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from entroloop.contract.records import Audit
from entroloop.infra.pii import PiiRedactor
from tests.unit.collectors.served_app import ServedApp

EMAIL = "carol@example.com"
ARGUMENTS = json.dumps({"city": "Paris", "notify": EMAIL})
CALL = {"id": "call_7", "type": "function", "function": {"name": "get_weather", "arguments": ARGUMENTS}}
CHAT = {"model": "base-m", "messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 32,
        "tools": [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]}


def _sse(events: list[dict]) -> bytes:
    return b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events) + b"data: [DONE]\n\n"


def _stream_events(content: str) -> list[dict]:
    """The answer as an engine streams it: role, optional text, then the call in three pieces."""
    def event(delta: dict, finish: str | None = None) -> dict:
        return {"id": "c1", "object": "chat.completion.chunk", "model": "base-m",
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}

    cut = len(ARGUMENTS) // 2
    head = {"index": 0, "id": "call_7", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
    return [
        event({"role": "assistant", "content": content} if content else {"role": "assistant"}),
        event({"tool_calls": [head]}),
        event({"tool_calls": [{"index": 0, "function": {"arguments": ARGUMENTS[:cut]}}]}),
        event({"tool_calls": [{"index": 0, "function": {"arguments": ARGUMENTS[cut:]}}]}, "tool_calls"),
    ]


def _engine(content: str) -> Starlette:
    """A served engine (real HTTP, so the gateway reads the stream as it would vLLM's)."""
    async def chat(request: Request) -> Response:
        if (await request.json()).get("stream"):
            return StreamingResponse(iter([_sse(_stream_events(content))]), media_type="text/event-stream")
        message = {"role": "assistant", "content": content or None, "tool_calls": [CALL]}
        return JSONResponse({"choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
                             "usage": {"prompt_tokens": 5, "completion_tokens": 12}})
    return Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])


def _audits(content: str) -> tuple[Audit, Audit]:
    published: list = []
    with ServedApp(_engine(content), "tool-call engine") as engine:
        config = GatewayConfig(upstream=engine.url, engine="vllm", node_id="gw-tools")
        with TestClient(create_app(config, published.append, PiiRedactor(b"tool-call-key"))) as client:
            assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
            with client.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as streamed:
                assert streamed.status_code == 200
                assert b"".join(streamed.iter_raw()).endswith(b"data: [DONE]\n\n")
    plain, stream = [r for r in published if isinstance(r, Audit)]
    return plain, stream


@pytest.mark.parametrize("content", ["", "Let me look that up."])
def test_a_streamed_tool_call_is_audited_as_the_same_call_unstreamed(content: str) -> None:
    plain, stream = _audits(content)
    assert stream.response == plain.response  # the stream put back together is the same answer
    assert "get_weather" in stream.response and "call_7" in stream.response and "Paris" in stream.response
    assert EMAIL not in stream.response and "[EMAIL:" in stream.response  # arguments redacted like any text
    if content:
        assert stream.response.startswith(content + "\n")  # the text and then the call, both kept


def test_message_text_keeps_content_and_calls() -> None:
    assert message_text({"content": "hi"}) == "hi"
    assert message_text({"content": None, "tool_calls": [CALL]}) == json.dumps([CALL], separators=(",", ":"))
    assert message_text({"content": "ok", "tool_calls": [CALL]}).startswith("ok\n[{")
    assert message_text({}) == ""
