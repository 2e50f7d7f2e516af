"""What an ``Audit.prompt`` holds, and the user's query inside it.

The gateway stores a chat request's prompt as the compact JSON of its ``messages`` list (system
prompt, earlier turns and all, so the audit can reproduce the request), and a completions request's
prompt as its text. Intent similarity must compare the answer with what the user asked *now*: the
last user message, not the JSON of the whole conversation nor the system prompt (embedding that JSON
made every answer look off-intent). This module is the one reading of that format, shared by the
gateway (which writes it) and the stream processors (which read it).
"""

from __future__ import annotations

import json
from typing import Any


def message_text(content: Any) -> str:
    """The text of one message's ``content``: a string, or a list of parts whose text parts are joined.

    OpenAI's content parts look like ``{"type": "text", "text": "..."}``; image, audio and file
    parts carry no text and are skipped; a bare string inside the list counts as text.
    """
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, dict) and isinstance(part.get("text"), str):
                texts.append(part["text"])
        return "\n".join(t for t in texts if t)
    return ""


def last_user_message(messages: list[Any]) -> str:
    """The text of the last message whose role is ``user`` (empty when there is none)."""
    for message in reversed(messages):
        if isinstance(message, dict) and message.get("role") == "user":
            text = message_text(message.get("content"))
            if text.strip():
                return text
    return ""


def intent_query(prompt: str) -> str:
    """The user's query in an audit prompt: the last user message of a chat, else the prompt itself.

    A prompt that is not a JSON list of role-tagged messages (a completions prompt, or an audit an
    application published itself with the question as its prompt) is returned unchanged; a chat
    without any user text falls back to the whole prompt, so nothing is silently scored as empty.
    """
    text = prompt.lstrip()
    if not text.startswith("["):
        return prompt
    try:
        messages = json.loads(text)
    except ValueError:
        return prompt
    if not isinstance(messages, list) or not any(isinstance(m, dict) and "role" in m for m in messages):
        return prompt
    return last_user_message(messages) or prompt


__all__ = ["intent_query", "last_user_message", "message_text"]
