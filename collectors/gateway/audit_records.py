"""From a finished exchange to the records the gateway publishes besides its span: Audit (in parts
when large) and, for engines without the entropy tap, the approximate TokenEntropy.

An audit over the codec's record limit (``ENTROLOOP_MAX_RECORD_BYTES``) used to become a dead letter
and never reach the write-once log. It is now published whole as several Audit records sharing one
``audit_id`` (``part_index`` / ``part_count``), each under the limit, each carrying the next slice of
the prompt and then of the response (cut at UTF-8 character boundaries, after redaction so no PII
entity is ever split before it is found). ``entroloop audit get`` joins them back.
"""

from __future__ import annotations

import msgspec
from entroloop.collectors.gateway import capture
from entroloop.collectors.gateway.exchange import Exchange

from entroloop.contract import codec
from entroloop.contract.ids import NodeStamper, uuid7
from entroloop.contract.records import (
    Audit,
    Event,
    TokenEntropy,
    pack_entropies,
    pack_token_hashes,
)
from entroloop.infra.pii import PiiRedactor

# Largest encoded part, whatever ENTROLOOP_MAX_RECORD_BYTES says: below librdkafka's default
# message.max.bytes (1,000,000) and the broker's (1 MiB), with room for the key and batch overhead,
# so a part is never refused by the producer either.
PART_LIMIT_BYTES = 768 * 1024
# Room left in each part for msgpack's string headers and the varying size of the part numbers.
_PART_MARGIN_BYTES = 64
_MIN_PART_TEXT_BYTES = 1024
MAX_PROMPT_VERSION_CHARS = 256  # a client-set header stored in every Audit record: bounded


def _cut(data: bytes, start: int, room: int) -> int:
    """End of the longest slice of ``data`` from ``start`` within ``room`` bytes, on a character boundary."""
    end = min(len(data), start + max(room, 0))
    while start < end < len(data) and data[end] & 0xC0 == 0x80:  # never split a UTF-8 sequence
        end -= 1
    return end


def split_audit(audit: Audit, max_bytes: int, stamper: NodeStamper, at: float) -> list[Audit]:
    """``audit`` itself when it encodes within ``max_bytes``, else its parts (each within it).

    Parts after the first get their own event id and seq (they are records of their own, so loss
    of one is countable); all share ``audit_id``, ``request_id`` and ``trace_id``."""
    if len(codec.encode(audit)) <= max_bytes:
        return [audit]
    overhead = len(codec.encode(msgspec.structs.replace(audit, prompt="", response="")))
    budget = max(max_bytes - overhead - _PART_MARGIN_BYTES, _MIN_PART_TEXT_BYTES)
    prompt, response = audit.prompt.encode(), audit.response.encode()
    slices: list[tuple[str, str]] = []
    p = r = 0
    while p < len(prompt) or r < len(response):
        p_end = _cut(prompt, p, budget)
        r_end = _cut(response, r, budget - (p_end - p)) if p_end == len(prompt) else r
        slices.append((prompt[p:p_end].decode(), response[r:r_end].decode()))
        p, r = p_end, r_end
    parts = []
    for index, (prompt_part, response_part) in enumerate(slices):
        stamp = {} if index == 0 else stamper.stamp(at)
        parts.append(msgspec.structs.replace(audit, **stamp, prompt=prompt_part, response=response_part,
                                             part_index=index, part_count=len(slices)))
    return parts


def build_records(
    exchange: Exchange,
    *,
    stamper: NodeStamper,
    redactor: PiiRedactor,
    route: str,
    tokenizer_digest: str,
    engine_version: str,
    max_record_bytes: int,
) -> list[Event]:
    """The Audit (in parts when large) and approximate TokenEntropy of one finished exchange
    (redaction happens before the Audit is built). The request's Span record comes from its OTel
    span (``tracing.py``).

    A request the engine answered, completely or not (``outcome`` other than ok: the engine failed
    mid-answer, the client left), gets an Audit with what had arrived; one the engine never
    answered (unreachable, an error status) gets none."""
    common = {"request_id": exchange.request_id, "trace_id": exchange.trace_id}
    answered = exchange.status_code == 200 and bool(exchange.response)
    if not answered and exchange.outcome == "ok":
        return []
    redacted = capture.redact_exchange(
        capture.prompt_of(exchange.path, exchange.body),
        capture.response_texts(exchange.path, exchange.response),
        redactor,
        sampling=capture.sampling_of(exchange.body),
        prompt_version=exchange.headers.get("x-entroloop-prompt-version", "")[:MAX_PROMPT_VERSION_CHARS],
    )
    audit = Audit(
        **stamper.stamp(exchange.end),  # type: ignore[arg-type]
        **common,
        audit_id=uuid7(exchange.end),
        model=exchange.model,
        adapter=exchange.adapter,
        prompt=redacted.prompt,
        response=redacted.response,
        route=route,
        tenant=exchange.tenant,
        user_id=redactor.pseudonymise_user(capture.user_of(exchange.body, exchange.headers)),
        prompt_template_version=redacted.prompt_version,
        sampling=redacted.sampling,
        tokenizer_digest=tokenizer_digest,
        engine_version=engine_version,
        redactions=redacted.counts,
        outcome=exchange.outcome,
    )
    part_limit = min(max_record_bytes, PART_LIMIT_BYTES)
    records: list[Event] = [*split_audit(audit, part_limit, stamper, exchange.end)]
    if exchange.entropies:
        records.append(
            TokenEntropy(
                **stamper.stamp(exchange.end),  # type: ignore[arg-type]
                **common,
                model=exchange.model,
                route=route,
                adapter=exchange.adapter,
                entropies=pack_entropies(exchange.entropies),
                token_hashes=pack_token_hashes(exchange.token_hashes)
                if exchange.token_hashes and len(exchange.token_hashes) == len(exchange.entropies) else b"",
                surprisals=pack_entropies(exchange.surprisals)
                if exchange.surprisals and len(exchange.surprisals) == len(exchange.entropies) else b"",
                approximate=True,
            )
        )
    return records


__all__ = ["PART_LIMIT_BYTES", "build_records", "split_audit"]
