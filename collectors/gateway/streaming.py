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
    """Collects an SSE completion stream's text deltas and usage into a non-streaming-shaped answer."""

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
            text = (choice.get("delta") or {}).get("content") if self._chat else choice.get("text")
            if isinstance(text, str) and text:
                if self.exchange.ttft_s is None:
                    self.exchange.ttft_s = time.time() - self.exchange.start
                self._texts.setdefault(_index(choice), []).append(text)
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

    def as_response(self) -> dict[str, Any]:
        choices = []
        for index in sorted(self._texts):
            text = "".join(self._texts[index])
            choices.append({"index": index, "message": {"content": text}} if self._chat else {"index": index, "text": text})
        return {"choices": choices, "usage": self._usage}


def _index(choice: dict[str, Any]) -> int:
    index = choice.get("index", 0)
    return index if isinstance(index, int) else 0


def error_event(message: str) -> bytes:
    """The SSE event that tells a streaming client its answer broke off (OpenAI's error shape)."""
    error = {"error": {"message": message, "type": "upstream_error", "code": 502}}
    return b"data: " + json.dumps(error).encode() + b"\n\n"


__all__ = ["StreamCollector", "error_event"]
