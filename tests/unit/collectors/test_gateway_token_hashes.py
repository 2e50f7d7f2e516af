"""Per-token hashes the gateway reads from an engine's logprobs (token text or ``token_id:N``)."""

from __future__ import annotations

import zlib

from entroloop.collectors.gateway.logprobs import (
    approximate_measures,
    approximate_token_hashes,
)
from entroloop.collectors.gateway.topk_entropy import token_hash


def _chat(tokens: list[dict]) -> dict:
    return {"choices": [{"index": 0, "logprobs": {"content": tokens}}]}


def _entry(token: str, with_bytes: bool = True) -> dict:
    entry = {"token": token, "logprob": -0.1, "top_logprobs": [{"token": token, "logprob": -0.1}]}
    if with_bytes:
        entry["bytes"] = list(token.encode())
    return entry


def test_token_ids_are_their_own_hash_as_the_tap_ships_them() -> None:
    assert token_hash("token_id:151643") == 151643
    assert token_hash("token_id:12", None) == 12


def test_text_tokens_hash_by_their_bytes_and_equal_tokens_hash_equal() -> None:
    assert token_hash("好", list("好".encode())) == zlib.crc32("好".encode())
    assert token_hash(" the") == token_hash(" the", list(b" the")) != token_hash("the")
    # an incomplete UTF-8 piece is named by its bytes, which stay distinct from the shown text
    assert token_hash("bytes:\\xe5", [0xE5]) == zlib.crc32(b"\xe5")
    assert token_hash(None) is None


def test_chat_hashes_line_up_with_entropies_and_show_a_repeating_cycle() -> None:
    cycle = [" and", " then", " again"]
    data = _chat([_entry(t) for t in ["Start", *cycle * 4]])
    hashes = approximate_token_hashes("/v1/chat/completions", data)
    assert hashes is not None and len(hashes) == len(approximate_measures("/v1/chat/completions", data)[0]) == 13
    assert hashes[1:4] == hashes[4:7] == hashes[7:10] == hashes[10:13]
    assert len(set(hashes[1:4])) == 3 and hashes[0] not in hashes[1:]


def test_completion_hashes_from_the_tokens_list() -> None:
    data = {"choices": [{"text": "ab", "logprobs": {
        "tokens": ["token_id:5", "token_id:9"], "token_logprobs": [-0.1, -0.2],
        "top_logprobs": [{"a": -0.1}, {"b": -0.2}],
    }}]}
    assert approximate_token_hashes("/v1/completions", data) == [5, 9]


def test_missing_or_misaligned_tokens_give_no_hashes_rather_than_wrong_ones() -> None:
    entries = [_entry("a"), {"logprob": -0.1, "top_logprobs": []}]
    assert approximate_token_hashes("/v1/chat/completions", _chat(entries)) is None
    misaligned = {"choices": [{"logprobs": {"tokens": ["a"], "top_logprobs": [{"a": -0.1}, {"b": -0.1}]}}]}
    assert approximate_token_hashes("/v1/completions", misaligned) is None
    assert approximate_token_hashes("/v1/chat/completions", {"choices": []}) == []
