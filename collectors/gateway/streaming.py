"""Relaying an SSE completion stream while collecting it for the audit."""

from __future__ import annotations

import json
import time
from typing import Any

from entroloop.collectors.gateway.exchange import Exchange
from entroloop.collectors.gateway.logprobs import (
    approximate_measures,
    approximate_token_hashes,
    restore_client_logprobs,
)


class StreamCollector:
    """Collects an SSE completion stream's text deltas, tool-call deltas and usage into a
    non-streaming-shaped answer (what the audit reads, the same as for an unstreamed answer)."""

    def __init__(self, exchange: Exchange, rewrite: bool = False, asked: int | None = None) -> None:
        self.exchange = exchange
        self.rewrite = rewrite  # take the gateway's logprobs out of each event (non-vLLM engines)
        self.asked = asked
        self.entropies: list[float] = []
        # One hash per entropy while every event named its tokens; None from the first that did not.
        self.token_hashes: list[int] | None = []
        self.surprisals: list[float] | None = []
        self._buffer = b""
        self._texts: dict[int, list[str]] = {}
        self._calls: dict[int, dict[int, ToolCall]] = {}  # choice index -> tool-call index -> call
        self._usage: dict[str, Any] = {}
        self._chat = exchange.path.endswith("chat/completions")

    def feed(self, chunk: bytes) -> bytes:
        """Read complete lines; returns the bytes to send on (``chunk`` itself unless rewriting)."""
        self._buffer += chunk
        out: list[bytes] = []
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            out.append(self._line(line) + b"\n")
        return b"".join(out) if self.rewrite else chunk

    def flush(self) -> bytes:
        """What is left after the last newline (normally nothing)."""
        rest, self._buffer = self._buffer, b""
        return self._line(rest) if self.rewrite and rest else b""

    def _line(self, line: bytes) -> bytes:
        stripped = line.strip()
        if not stripped.startswith(b"data:"):
            return line
        payload = stripped[5:].strip()
        if payload == b"[DONE]":
            return line
        try:
            event = json.loads(payload)
        except ValueError:
            return line
        if not isinstance(event, dict):
            return line
        self._usage = event.get("usage") or self._usage
        for choice in event.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            delta = (choice.get("delta") or {}) if self._chat else {}
            text = delta.get("content") if self._chat else choice.get("text")
            calls = delta.get("tool_calls") if isinstance(delta, dict) else None
            if ((isinstance(text, str) and text) or calls) and self.exchange.ttft_s is None:
                self.exchange.ttft_s = time.time() - self.exchange.start
            if isinstance(text, str) and text:
                self._texts.setdefault(_index(choice), []).append(text)
            if isinstance(calls, list):
                self._add_tool_calls(_index(choice), calls)
        if not self.rewrite:
            return line
        first = [c for c in event.get("choices") or [] if isinstance(c, dict) and _index(c) == 0]
        if first:
            entropies, surprisals = approximate_measures(self.exchange.path, {"choices": first})
            self.entropies += entropies
            hashes = approximate_token_hashes(self.exchange.path, {"choices": first})
            if self.token_hashes is not None and hashes is not None and len(hashes) == len(entropies):
                self.token_hashes += hashes
            else:
                self.token_hashes = None
            if self.surprisals is not None and surprisals is not None and len(surprisals) == len(entropies):
                self.surprisals += surprisals
            else:
                self.surprisals = None
        restore_client_logprobs(self.exchange.path, event, self.asked)
        return b"data: " + json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode()

    def _add_tool_calls(self, choice: int, deltas: list[Any]) -> None:
        """Tool calls arrive in pieces: the first delta of a call has its id, type and name, the
        following ones slices of its ``arguments`` JSON, each naming the call by ``index``."""
        calls = self._calls.setdefault(choice, {})
        for position, delta in enumerate(deltas):
            if not isinstance(delta, dict):
                continue
            index = delta.get("index", position)
            call = calls.setdefault(index if isinstance(index, int) else position, ToolCall())
            call.add(delta)

    def as_response(self) -> dict[str, Any]:
        choices = []
        for index in sorted(self._texts.keys() | self._calls.keys()):
            text = "".join(self._texts.get(index, []))
            if not self._chat:
                choices.append({"index": index, "text": text})
                continue
            message: dict[str, Any] = {"content": text}
            if calls := self._calls.get(index):
                message["tool_calls"] = [calls[i].as_dict() for i in sorted(calls)]
            choices.append({"index": index, "message": message})
        return {"choices": choices, "usage": self._usage}


class ToolCall:
    """One streamed tool call, put together from its deltas in the shape of an unstreamed answer's."""

    def __init__(self) -> None:
        self.id = ""
        self.type = "function"
        self.name: list[str] = []
        self.arguments: list[str] = []

    def add(self, delta: dict[str, Any]) -> None:
        if isinstance(delta.get("id"), str) and delta["id"]:
            self.id = delta["id"]
        if isinstance(delta.get("type"), str) and delta["type"]:
            self.type = delta["type"]
        function = delta.get("function")
        if isinstance(function, dict):
            if isinstance(function.get("name"), str):
                self.name.append(function["name"])
            if isinstance(function.get("arguments"), str):
                self.arguments.append(function["arguments"])

    def as_dict(self) -> dict[str, Any]:
        return {"id": self.id, "type": self.type,
                "function": {"name": "".join(self.name), "arguments": "".join(self.arguments)}}


def _index(choice: dict[str, Any]) -> int:
    index = choice.get("index", 0)
    return index if isinstance(index, int) else 0


def error_event(message: str) -> bytes:
    """The SSE event that tells a streaming client its answer broke off (OpenAI's error shape)."""
    error = {"error": {"message": message, "type": "upstream_error", "code": 502}}
    return b"data: " + json.dumps(error).encode() + b"\n\n"


__all__ = ["StreamCollector", "ToolCall", "error_event"]
