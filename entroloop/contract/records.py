"""Event contract v1: the typed records every stage exchanges.

Each record is a msgspec ``Struct`` tagged by ``kind`` so one decoder reads any topic. The common
fields come first (DESIGN.md, "Event contract"): ``event_id`` (UUIDv7), ``schema_version``,
``emitted_at`` (unix seconds), ``node_id`` with a per-node monotonically increasing ``seq`` (so loss
is countable end to end), ``request_id`` (the Kafka key of every topic) and ``trace_id`` (W3C,
32 hex digits).

Validation happens at decode, so a record that is well-formed MessagePack but wrong never reaches
a processor or a sink (where one bad row used to fail a whole ClickHouse insert on every rerun):
it becomes a dead letter with the reason. Two layers:

* field constraints (``msgspec.Meta``, checked by the decoder in C, only on decode): event ids are
  canonical UUIDs (the tables' ``event_id UUID`` column); ``seq``, counts and offsets are
  non-negative and fit their UInt32/UInt64 columns; ``rating`` is in ``RATING_MIN..RATING_MAX``;
  timestamps are finite, above 0 and below ``LATEST_EVENT_TIME`` (2100), which rejects NaN, Inf,
  an unset clock (0) and milliseconds sent as seconds (1e12);
* ``__post_init__`` (msgspec runs it on decode and on construction) for what one field's type
  cannot say: NaN entropy, an odd-length float16 buffer. It raises in the producer too, so it
  holds only checks a correct producer never fails (a span ending before it starts is left alone:
  clock steps make it happen and it harms no table).

Time relative to *now* (too old for the tables' TTL, e.g. a 1970 clock; too far in the future)
is a property of the moment of reading, not of the record: ``entroloop.contract.codec.EventTimeWindow``
checks it. (The types stay free of a wall-clock floor, so processor state and archives holding
records of any age still decode.)
"""

from __future__ import annotations

import math
from typing import Annotated, ClassVar

import msgspec
import numpy as np

SCHEMA_VERSION = 1

Scalar = str | int | float | bool | None

# The documented feedback scale: thumbs (-1/0/+1), 1-5 stars and 0-10 scores all fit; the column is
# Int8, so anything wider (rating=1000) used to fail the insert of the whole batch.
RATING_MIN = -10
RATING_MAX = 10
NEGATIVE_RATING = -1  # the signed scale: a rating at or below this (below 0) is a negative verdict
# Event times (unix seconds) end before 2100-01-01: 1e12 is milliseconds sent as seconds, and
# ClickHouse's DateTime64 ends in 2299. Too old (a 1970 clock) is the codec's time window's call.
LATEST_EVENT_TIME = 4_102_444_800.0
_UINT32_MAX = 2**32 - 1
_INT32_MAX = 2**31 - 1
_INT64_MAX = 2**63 - 1  # msgspec bounds must fit an int64; MessagePack producers stay below it

# Constraints are checked by msgspec while decoding (not on construction, so tests and processors
# build records freely); each costs one comparison in C.
# The length is checked by the decoder (C); the 8-4-4-4-12 hex layout by the codec, which checks a
# whole batch in a few C passes (a msgspec ``pattern`` would run a regex per record: +25% decode).
EventId = Annotated[str, msgspec.Meta(min_length=36, max_length=36, description="a canonical UUID (UUIDv7)")]
EventTime = Annotated[float, msgspec.Meta(gt=0.0, le=LATEST_EVENT_TIME)]  # also refuses NaN, -Inf
# span bounds only need to be finite and fit DateTime64(6) (emitted_at is what windows and TTL use)
SpanTime = Annotated[float, msgspec.Meta(ge=0.0, le=LATEST_EVENT_TIME)]
Seq = Annotated[int, msgspec.Meta(ge=0, le=_INT64_MAX)]
Count32 = Annotated[int, msgspec.Meta(ge=0, le=_UINT32_MAX)]
Count64 = Annotated[int, msgspec.Meta(ge=0, le=_INT64_MAX)]
Rating = Annotated[int, msgspec.Meta(ge=RATING_MIN, le=RATING_MAX)]
TokenIndex = Annotated[int, msgspec.Meta(ge=-1, le=_INT32_MAX)]  # -1: not about a token


class Event(msgspec.Struct, kw_only=True, tag_field="kind", omit_defaults=False):
    """Fields shared by every record."""

    event_id: EventId
    emitted_at: EventTime
    node_id: str
    seq: Seq
    request_id: str
    trace_id: str = ""
    schema_version: int = SCHEMA_VERSION

    topic: ClassVar[str]


# High bytes of the little-endian float16 values that are finite and >= 0 (bits below 0x7C00).
_FLOAT16_HIGH_BYTES_BELOW_INF = bytes(range(0x7C))


class TokenEntropy(Event, tag="token_entropy"):
    """Full-vocabulary Shannon entropy (nats) of each generated token, packed as little-endian float16.

    One record per request, or per chunk for very long generations (``chunk_index`` counts from 0,
    ``first_token_index`` is the position of the chunk's first token, ``final`` marks the last chunk).
    ``approximate`` is true when the entropy was computed from top-k logprobs (proxy mode) instead
    of the full vocabulary.

    ``token_hashes`` (optional, empty when the tap does not send it) is the sampled token id of each
    generated token (or a 32-bit hash of it), packed little-endian uint32, one per entropy: it lets
    a detector confirm a loop by actual repetition of the tokens rather than by low entropy alone.
    Records written before it existed decode with it empty.

    ``surprisals`` (optional, empty when the sender does not have it) is each sampled token's own
    surprisal, ``-log p(token)`` in nats under the model's distribution before temperature, packed
    like ``entropies`` (float16, one per entropy). Entropy is the *expected* surprisal; a sampled
    token far more surprising than that, token after token, is the model being made to say what it
    would not (high-temperature gibberish), which the pre-temperature entropy barely shows. A sender
    that receives logprobs (vLLM's ``logprobs`` with its default ``raw_logprobs`` mode) has it for
    free. Records written before it existed decode with it empty.

    ``sampling_entropies`` (optional, empty when the sender does not have it) is each token's entropy
    at the request's sampling temperature, ``H(softmax(logits / T))`` over the full vocabulary
    (before top-k/top-p), packed like ``entropies``: the entropy of the distribution the token was
    actually drawn from, as far as temperature goes. ``entropies`` is the model's own uncertainty
    and does not change with temperature, so a sampler run too hot (word salad) shows only here and
    in ``surprisals``; unlike those, this needs no token ids. Sent for sampled requests (T > 0; at
    T = 1 it equals ``entropies``), never for greedy ones. Records written before it existed decode
    with it empty.
    """

    model: str
    route: str = "default"
    adapter: str = ""
    entropies: bytes = b""
    chunk_index: Count32 = 0
    first_token_index: Count32 = 0
    final: bool = True
    approximate: bool = False
    token_hashes: bytes = b""
    surprisals: bytes = b""
    sampling_entropies: bytes = b""

    topic: ClassVar[str] = "entroloop.tokens.v1"

    def __post_init__(self) -> None:
        if len(self.entropies) % 2:
            raise ValueError("entropies must be a packed float16 array (even number of bytes)")
        # Runs on every decode, so the common case is one C pass over the high bytes: a float16
        # whose bits are >= 0x7C00 (high byte >= 0x7C) is Inf/NaN (exponent all ones) or negative
        # (sign bit). Deleting the bytes below 0x7C leaves nothing for valid data (~5x cheaper than
        # a numpy view and reduction per record); numpy looks closer only when something is left.
        if self.entropies[1::2].translate(None, _FLOAT16_HIGH_BYTES_BELOW_INF):
            bits = np.frombuffer(self.entropies, dtype="<u2")
            bad = bits[(bits >= 0x7C00) & (bits != 0x8000)]  # -0.0 is a harmless zero
            if bad.size:
                value = float(bad.view("<f2")[0])
                raise ValueError("entropies contain NaN or Inf" if not np.isfinite(value) else "entropies must be >= 0 nats")
        if self.token_hashes and len(self.token_hashes) != 2 * len(self.entropies):
            raise ValueError(
                f"token_hashes must be one packed uint32 per token ({len(self.entropies) // 2} tokens, "
                f"{len(self.token_hashes)} bytes of hashes)"
            )
        for name in ("surprisals", "sampling_entropies"):
            packed = getattr(self, name)
            if not packed:
                continue
            if len(packed) != len(self.entropies):
                raise ValueError(
                    f"{name} must be one packed float16 per token ({len(self.entropies) // 2} tokens, "
                    f"{len(packed)} bytes of {name})"
                )
            if packed[1::2].translate(None, _FLOAT16_HIGH_BYTES_BELOW_INF):  # as for entropies above
                bits = np.frombuffer(packed, dtype="<u2")
                if ((bits >= 0x7C00) & (bits != 0x8000)).any():
                    raise ValueError(f"{name} contain NaN, Inf or a negative value (nats >= 0 expected)")

    def values(self) -> np.ndarray:
        """The entropies as a float16 numpy view (no copy)."""
        return np.frombuffer(self.entropies, dtype="<f2")

    def hashes(self) -> np.ndarray | None:
        """The token ids/hashes as a uint32 numpy view, or None when the record carries none."""
        return np.frombuffer(self.token_hashes, dtype="<u4") if self.token_hashes else None

    def surprisal_values(self) -> np.ndarray | None:
        """The sampled tokens' surprisals as a float16 view, or None when the record carries none."""
        return np.frombuffer(self.surprisals, dtype="<f2") if self.surprisals else None

    def sampling_values(self) -> np.ndarray | None:
        """The entropies at the sampling temperature as a float16 view, or None when the record carries none."""
        return np.frombuffer(self.sampling_entropies, dtype="<f2") if self.sampling_entropies else None

    @property
    def n_tokens(self) -> int:
        return len(self.entropies) // 2


def pack_entropies(values: np.ndarray | list[float]) -> bytes:
    """Pack entropies (nats) into the wire format: little-endian float16, 2 bytes per token."""
    return np.asarray(values, dtype="<f2").tobytes()


def pack_token_hashes(ids: np.ndarray | list[int]) -> bytes:
    """Pack sampled token ids (or hashes) into the wire format: little-endian uint32, 4 bytes per token.

    Ids are taken modulo 2**32 so a vocabulary id or any 64-bit hash fits."""
    return (np.asarray(ids, dtype=np.int64) & 0xFFFFFFFF).astype("<u4").tobytes()


class Span(Event, tag="span"):
    """One OpenTelemetry span. Request spans carry the serving timings in seconds."""

    span_id: str
    name: str
    start_time: SpanTime
    end_time: SpanTime
    parent_span_id: str = ""
    model: str = ""
    route: str = "default"
    status: str = "ok"
    queue_s: float | None = None
    prefill_s: float | None = None
    decode_s: float | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None
    prompt_tokens: Count32 | None = None
    output_tokens: Count32 | None = None
    attributes: dict[str, Scalar] = {}

    topic: ClassVar[str] = "entroloop.spans.v1"


class Audit(Event, tag="audit"):
    """What the model was asked and answered, with everything needed to reproduce it.

    PII is redacted before this record is built (``redactions`` counts entities per type);
    ``user_id`` is a keyed pseudonym, never the raw identity.
    """

    audit_id: str
    model: str
    prompt: str
    response: str
    route: str = "default"
    adapter: str = ""
    tenant: str = ""
    user_id: str = ""
    prompt_template_version: str = ""
    sampling: dict[str, Scalar] = {}
    tokenizer_digest: str = ""
    engine_version: str = ""
    language: str = ""
    redactions: dict[str, Count32] = {}
    # "ok", or why the answer is incomplete: "upstream_error" (the engine failed mid-answer; the
    # response holds what had arrived), "client_disconnected" (the client left mid-stream).
    outcome: str = "ok"
    # An audit too large for one record (codec max bytes) is published whole as ``part_count``
    # records sharing one ``audit_id``; each carries the next slice of ``prompt`` and ``response``
    # (concatenate by ``part_index`` to get them back; ``entroloop audit get`` does).
    part_index: int = 0
    part_count: int = 1

    topic: ClassVar[str] = "entroloop.audit.v1"


class Feedback(Event, tag="feedback"):
    """A user's verdict on one answer; ``corrected_answer`` is what the answer should have been.

    ``rating`` is on the documented signed scale ``RATING_MIN..RATING_MAX`` (-10..10) whose sign is the
    verdict: below 0 negative, 0 neutral, above 0 positive (thumbs down/up as -1/+1, five stars as
    -2..+2, a 0..10 score as -5..+5). ``ENTROLOOP_BADCASE_NEGATIVE_RATING`` (default -1) is the one
    "negative" threshold every stage reads. A rating outside the scale is rejected at decode (a dead letter).

    ``tenant`` is the tenant of the API key that posted the verdict (the gateway sets it; empty
    from producers that predate it). The bad-case join takes a correction only from the tenant
    the answer was served to (``Audit.tenant``), so one tenant cannot feed another's bad cases
    and retraining data.
    """

    rating: Rating
    user_id: str = ""
    error_type: str = ""
    corrected_answer: str = ""
    comment: str = ""
    tenant: str = ""

    topic: ClassVar[str] = "entroloop.feedback.v1"


def verdict_applies(feedback_tenant: str, audit_tenant: str) -> bool:
    """Whether a verdict posted by ``feedback_tenant`` may judge an answer served to ``audit_tenant``.

    Request ids travel in responses and logs, so another tenant can learn one; its verdicts must not
    turn that answer into a bad case or drop it from retraining data. An empty tenant on either side
    (a producer that predates the field, an answer served without API keys) names no owner: it applies.
    The same rule, in SQL, is in ``training/sources.py``.
    """
    return not feedback_tenant or not audit_tenant or feedback_tenant == audit_tenant


class Fallback(Event, tag="fallback"):
    """A request answered by a fallback tier (gateway decision or low intent similarity)."""

    model: str
    reason: str
    route: str = "default"
    from_tier: str = "primary"
    to_tier: str = "fallback"
    source: str = "gateway"

    topic: ClassVar[str] = "entroloop.fallbacks.v1"


class IntentScore(Event, tag="intent_score"):
    """Cosine similarity between the query and the answer embeddings."""

    model: str
    similarity: float
    route: str = "default"
    language: str = ""
    embedder: str = ""
    threshold: float = 0.0

    topic: ClassVar[str] = "entroloop.intent.v1"

    def __post_init__(self) -> None:
        if not math.isfinite(self.similarity):
            raise ValueError("similarity must be finite")


class BadCase(Event, tag="bad_case"):
    """A user correction joined with the audited answer, diffed and labelled."""

    model: str
    prompt: str
    response: str
    correction: str
    route: str = "default"
    adapter: str = ""
    audit_id: str = ""
    labels: list[str] = []
    diff: list[tuple[str, str, str]] = []
    minimal_span: tuple[Count32, Count32] = (0, 0)
    confidence: float = 0.0

    topic: ClassVar[str] = "entroloop.badcases.v1"


class Alert(Event, tag="alert"):
    """Something a rule found. ``alert_key`` identifies the finding; actions run once per key."""

    alert_key: str
    rule: str
    severity: str = "warning"
    model: str = ""
    route: str = "default"
    subject_node: str = ""
    token_start: TokenIndex = -1
    token_end: TokenIndex = -1
    value: float = 0.0
    threshold: float = 0.0
    baseline: str = ""
    detail: str = ""
    source_event_id: str = ""

    topic: ClassVar[str] = "entroloop.alerts.v1"


class Action(Event, tag="action"):
    """An action taken in response to an alert or by the retraining loop, for the audit trail."""

    action_id: str
    action: str
    alert_key: str = ""
    runbook: str = ""
    runbook_version: str = ""
    dry_run: bool = False
    outcome: str = ""
    detail: str = ""

    topic: ClassVar[str] = "entroloop.actions.v1"


class RetrainRequest(Event, tag="retrain_request"):
    """Ask the trainer for one incremental fine-tune; ``trigger_key`` is unique per trigger."""

    trigger_key: str
    model: str
    category: str
    reason: str
    adapter: str = ""
    window_start: float = 0.0
    window_end: float = 0.0
    bad_case_count: Count32 = 0

    topic: ClassVar[str] = "entroloop.retrain.v1"


class Health(Event, tag="health"):
    """A pipeline health gauge (consumer lag, last commit age, spool size, ...)."""

    component: str
    metric: str
    value: float
    labels: dict[str, str] = {}

    topic: ClassVar[str] = "entroloop.health.v1"


class DeadLetter(Event, tag="dead_letter"):
    """Bytes that could not become a record, kept with the reason so nothing is lost silently.

    ``payload`` carries (the first bytes of) the raw record between stages only; the stage that
    stores a dead letter moves them to the write-once quarantine (``entroloop.infra.quarantine``,
    read by this record's ``event_id``) and keeps just ``payload_sha256`` and ``payload_size``:
    the raw bytes may hold prompts and answers in clear.
    """

    source_topic: str
    source_partition: Count32
    source_offset: Count64
    reason: str
    error_type: str
    payload: bytes = b""
    payload_size: Count64 = 0
    payload_sha256: str = ""  # of the whole payload, even when ``payload`` holds only its start

    topic: ClassVar[str] = "entroloop.deadletter.v1"


RECORD_TYPES: tuple[type[Event], ...] = (
    TokenEntropy,
    Span,
    Audit,
    Feedback,
    Fallback,
    IntentScore,
    BadCase,
    Alert,
    Action,
    RetrainRequest,
    Health,
    DeadLetter,
)

AnyRecord = (
    TokenEntropy
    | Span
    | Audit
    | Feedback
    | Fallback
    | IntentScore
    | BadCase
    | Alert
    | Action
    | RetrainRequest
    | Health
    | DeadLetter
)

__all__ = [
    "SCHEMA_VERSION",
    "RATING_MIN",
    "RATING_MAX",
    "LATEST_EVENT_TIME",
    "RECORD_TYPES",
    "AnyRecord",
    "Event",
    "TokenEntropy",
    "Span",
    "Audit",
    "Feedback",
    "Fallback",
    "IntentScore",
    "BadCase",
    "Alert",
    "Action",
    "RetrainRequest",
    "Health",
    "DeadLetter",
    "pack_entropies",
    "pack_token_hashes",
    "verdict_applies",
]
