"""Bad cases: a user's correction joined with the audited answer, diffed, labelled and scored.

Feedback and audit of one request share its Kafka key (``request_id``), so both land on the same
partition and the join needs no repartition. Either may arrive first: whichever comes first waits
in ``state`` (a dict keyed by request id whose values are msgspec Structs, so a Faust table with a
changelog can hold it: ``encode_entry``/``decode_entry`` are the table's value serializer) until its
partner comes or ``ttl_s`` of event time passes. The audit stays after a join so a second
correction of the same answer joins too; each feedback joins once (its event id is remembered).

The output ``BadCase`` is derived from the feedback, so it has the same event id whichever
arrival order produced it, and a redelivered feedback never becomes a second bad case.

A correction joins only the answer of its own tenant: request ids travel in responses and logs,
and a tenant that learns another's could otherwise post corrections that flow into that tenant's
bad cases, regression suite and retraining data. A feedback whose ``tenant`` differs from the
audit's becomes a ``DeadLetter`` (``error_type="tenant_mismatch"``, kept with the reason, nothing
joined). An empty tenant on either side (feedback from a producer that predates the field, an
answer served without API keys) names no owner, and joins as before.

Expiry runs on every watermark (every 0.25 s under the worker), so it must not scan the state: the
joiner keeps an index of entries by tenant and ``last_seen`` (``entroloop.streams.join_expiry``, heaps)
and pops only the expired.
Entries that reach ``state`` without passing through ``process`` (recovered from the changelog
after a restart or a rebalance) are indexed by a full scan when the state's size no longer matches
the index, and at least once per ``ttl_s`` of event time whatever the size says.

Every audit enters the state, and most are never corrected, so the TTL alone lets it grow with
all traffic (a week of prompts and answers in memory, in the changelog, and replayed by a
restarted worker). ``max_requests`` bounds it: above it, each watermark drops requests of the
tenant holding the most, longest-idle first (so one tenant's burst cannot push the others' answers
out), and counts them in ``evicted``.
"""

from __future__ import annotations

import difflib
import hashlib
import re
from collections.abc import MutableMapping, Sequence
from operator import attrgetter
from typing import ClassVar

import msgspec
from entroloop.streams.base import Processor, derive
from entroloop.streams.correction_labels import quantities_in
from entroloop.streams.join_expiry import TenantExpiryIndex
from entroloop.streams.rules import (
    _CJK,
    FACT,
    OTHER,
    ResponseRules,
    Token,
    date_spans,
    tokenize,
)
from entroloop.streams.table_state import TableStateSpec

from entroloop.contract.codec import encode
from entroloop.contract.records import (
    NEGATIVE_RATING,
    Audit,
    BadCase,
    DeadLetter,
    Event,
    Feedback,
    verdict_applies,
)
from entroloop.contract.settings import Settings
from entroloop.contract.topics import partition_for
from entroloop.infra.pii import PiiRedactor, redactor_for_service

_CJK_CHAR = re.compile(f"[{_CJK}]")

# Label added to bad cases confident enough for the regression suite the training gate replays.
REGRESSION_LABEL = "regression"


class JoinedAudit(msgspec.Struct):
    """What the join keeps of an audit: the texts a bad case diffs and the fields it copies.

    Not the whole record: every answer waits in the changelogged join state for a correction that
    mostly never comes, so its sampling, user, engine and id fields would cost a second encoding's
    worth per answer for nothing (718 -> 276 bytes on fleet answers). A changelog written with whole
    audits reads back into this (msgpack maps by name; the other fields are ignored)."""

    audit_id: str
    model: str
    prompt: str
    response: str
    route: str = "default"
    adapter: str = ""
    tenant: str = ""

    @classmethod
    def of(cls, audit: Audit) -> JoinedAudit:
        return cls(audit.audit_id, audit.model, audit.prompt, audit.response, audit.route, audit.adapter,
                   audit.tenant)


class JoinEntry(msgspec.Struct):
    """What one request id is waiting with: its audit, or feedbacks that came before the audit;
    and the (redacted) feedbacks already joined, so a redelivery makes their bad cases again."""

    audit: JoinedAudit | None = None
    waiting_feedback: list[Feedback] = []
    joined_feedback: list[Feedback] = []
    last_seen: float = 0.0


def entry_tenant(entry: JoinEntry) -> str:
    """Whose request an entry holds: the answer's tenant, or, before the answer came, the correction's."""
    if entry.audit is not None:
        return entry.audit.tenant
    return entry.waiting_feedback[0].tenant if entry.waiting_feedback else ""


JOIN_STATE: TableStateSpec[JoinEntry] = TableStateSpec.msgpack("bad_case_join", JoinEntry, key_of=attrgetter("request_id"))
encode_entry = JOIN_STATE.encode
"""Table value serializer (changelog bytes)."""
decode_entry = JOIN_STATE.decode


# --- diff and minimal failing example --------------------------------------------------------


def token_diff(response: str, correction: str) -> list[tuple[str, str, str]]:
    """The changes from response to correction, token by token: (op, old text, new text).

    ``op`` is replace, delete or insert (equal runs are left out: the diff says what changed).
    Texts are slices of the originals, so spacing and punctuation are exact.
    """
    a, b = tokenize(response), tokenize(correction)
    matcher = difflib.SequenceMatcher(None, [t.text for t in a], [t.text for t in b], autojunk=False)
    out = []
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == "equal":
            continue
        out.append((op, _slice(response, a, i1, i2), _slice(correction, b, j1, j2)))
    return out


def _slice(text: str, tokens: Sequence[Token], i1: int, i2: int) -> str:
    if i1 >= i2:
        return ""
    return text[tokens[i1].start : tokens[i2 - 1].end]


def minimal_failing_span(response: str, correction: str) -> tuple[tuple[int, int], str]:
    """The smallest span ``[start, end)`` of the response whose replacement yields the correction.

    Returns the span (character offsets into the response) and its replacement, so
    ``response[:start] + replacement + response[end:] == correction`` always holds. It strips the
    longest common prefix and suffix, then widens to whole chunks (``example_chunks``: a number
    with its unit, a date, a word, a run of CJK characters), so a label never points at half a
    token: 12.5 -> 12.8 blames ``12.5``, 500g -> 500mg blames ``500g``. A pure insertion touches
    the chunk at its point, so the span is empty only when nothing changed (500.5元 -> 500.50元
    blames ``500.5元``).
    """
    limit = min(len(response), len(correction))
    prefix = 0
    while prefix < limit and response[prefix] == correction[prefix]:
        prefix += 1
    suffix = 0
    while (
        suffix < limit - prefix
        and response[len(response) - 1 - suffix] == correction[len(correction) - 1 - suffix]
    ):
        suffix += 1
    start, end = prefix, len(response) - suffix
    # Widening stays inside the common prefix/suffix, so the identity above still holds.
    chunks = example_chunks(response)
    if start == end and response != correction:  # an insertion: the chunk it touches (before, else after)
        touching = [c for c in chunks if c[0] < start <= c[1]] or [c for c in chunks if c[0] == start]
        # inside spacing: the nearest chunk on the left, else on the right
        nearest = [c for c in chunks if c[1] < start][-1:] or [c for c in chunks if c[0] > start][:1]
        if touching or nearest:
            c_start, c_end = (touching or nearest)[0]
            start, end = min(start, c_start), max(end, c_end)  # a superset: the identity holds
    for c_start, c_end in chunks:
        if c_start < end and start < c_end:  # overlaps the changed span
            start, end = min(start, c_start), max(end, c_end)
    replacement = correction[start : len(correction) - (len(response) - end)]
    return (start, end), replacement


def example_chunks(text: str) -> list[tuple[int, int]]:
    """The units a failing example is made of, as (start, end): dates and numbers with their
    multiplier and unit or currency whole, then words and runs of adjacent CJK characters;
    other symbols one by one."""
    taken: list[tuple[int, int]] = []
    for start, end, _ in date_spans(text):
        taken.append((start, end))
    for q in quantities_in(text):
        if not any(s < q.end and q.start < e for s, e in taken):
            taken.append((q.start, q.end))
    chunks = list(taken)
    run: tuple[int, int] | None = None
    for token in tokenize(text):
        if any(s <= token.start < e for s, e in taken):
            continue
        if _is_cjk(token.text) and run is not None and run[1] == token.start:
            run = (run[0], token.end)
            continue
        if run is not None:
            chunks.append(run)
            run = None
        if _is_cjk(token.text):
            run = (token.start, token.end)
        else:
            chunks.append((token.start, token.end))
    if run is not None:
        chunks.append(run)
    return sorted(chunks)


def _is_cjk(text: str) -> bool:
    return len(text) == 1 and bool(_CJK_CHAR.match(text))


# --- confidence ------------------------------------------------------------------------------


def bad_case_confidence(
    rule_labels: Sequence[str],
    span: tuple[int, int],
    response: str,
    feedback: Feedback,
    negative_rating: int,
) -> float:
    """How sure we are the answer was wrong in the way the labels say (0..1).

    Evidence, added up from a base of 0.1: a rule other than ``fact`` explains the change (0.3); the correction is
    focused, replacing at most a third of the answer (0.2: a rewrite says more about taste than
    about an error, and makes rule hits likely incidental); the user rated it badly (0.2); the
    user declared an error type (0.1), and it names one of the rule labels (0.1 more).
    """
    score = 0.1
    # ``fact`` alone says only that the meaning changed (any rewrite does): not a rule's explanation.
    if set(rule_labels) - {FACT}:
        score += 0.3
    if response and (span[1] - span[0]) <= len(response) / 3:
        score += 0.2
    if feedback.rating <= negative_rating:
        score += 0.2
    if feedback.error_type:
        score += 0.1
        if feedback.error_type.lower() in rule_labels:
            score += 0.1
    return round(min(score, 1.0), 3)


# --- the processor ---------------------------------------------------------------------------


class BadCaseJoiner(Processor):
    """Join ``Feedback`` carrying a ``corrected_answer`` with the ``Audit`` of the same request.

    Input: ``Audit``, ``Feedback`` (feedback without a correction is ignored: nothing to diff).
    Output: ``BadCase`` with ``diff`` (token_diff), ``minimal_span`` (character offsets into the
    response, from minimal_failing_span), ``labels`` (rule labels from ``ResponseRules.compare``,
    then the feedback's ``error_type`` lower-cased if given, ``other`` when neither; plus
    ``regression`` at or above ``regression_confidence``) and ``confidence``.
    """

    name = "bad_cases"
    inputs = (Audit, Feedback)
    # Under Faust, ``state`` is this changelogged table (entroloop.streams.table_state): the join survives a
    # worker restart. Expiry deletes entries, which writes tombstones, so recovery drops them too.
    table_state: ClassVar[TableStateSpec[JoinEntry]] = JOIN_STATE

    def __init__(
        self,
        rules: ResponseRules | None = None,
        ttl_s: float = 7 * 86_400,
        regression_confidence: float = 0.8,
        negative_rating: int = NEGATIVE_RATING,
        state: MutableMapping[str, JoinEntry] | None = None,
        redactor: PiiRedactor | None = None,
        max_requests: int = 200_000,
    ) -> None:
        self.rules = rules or ResponseRules()
        # The user's correction and comment are free text that reaches the join state (a changelog
        # topic) and the bad_cases table: redacted like the gateway redacts prompts, with the same
        # key, so placeholders in the answer and in the correction match and the diff stays true.
        # None: a random per-process key (tests, demos); from_settings uses ENTROLOOP_PII_HASH_KEY.
        self.redactor = redactor if redactor is not None else PiiRedactor(None)
        self.ttl_s = ttl_s
        # Every audit waits here for a correction that mostly never comes: without a bound the state
        # (and its changelog, and a restart's recovery) grows with all traffic for ``ttl_s``.
        self.max_requests = max_requests
        self.evicted = 0  # requests dropped for the bound (reported as the table_evicted health metric)
        self.regression_confidence = regression_confidence
        self.negative_rating = negative_rating
        # request_id -> JoinEntry. A Faust table (with changelog) can stand in for this dict: every
        # change is written back with ``state[key] = entry`` so the table sees it.
        self.state: MutableMapping[str, JoinEntry] = state if state is not None else {}
        self.expired_unjoined = 0
        self.refused_other_tenant = 0
        # request ids by tenant and last_seen, so expiry and the bound touch only what they drop
        self._expiry = TenantExpiryIndex()
        self._full_scan_due: float | None = None  # event time of the next full scan (None: at the next watermark)

    @classmethod
    def from_settings(cls, settings: Settings, rules: ResponseRules | None = None) -> BadCaseJoiner:
        return cls(
            # The deployment's compliance lexicon and patterns, the same the per-response rules use.
            rules=rules or ResponseRules.from_settings(settings),
            ttl_s=settings.badcase_join_ttl_s,
            max_requests=settings.badcase_join_max_requests,
            regression_confidence=settings.badcase_regression_confidence,
            negative_rating=settings.badcase_negative_rating,
            # Without the key it still redacts, but its pseudonyms differ from the gateway's: warn.
            redactor=redactor_for_service(settings, "bad-case joiner", refuse_in_production=False),
        )

    def process(self, record: Event) -> list[Event]:
        if isinstance(record, Audit):
            if record.part_index:  # a large audit in parts: the first part starts the answer to diff
                return []
            entry = self.state.get(record.request_id)
            if entry is None:
                entry = JoinEntry()
                self.state[record.request_id] = entry
            elif (held_for := entry_tenant(entry)) != record.tenant:
                self._expiry.discard(record.request_id, held_for)  # held for the answer's tenant from now on
            entry.audit = JoinedAudit.of(record)
            entry.last_seen = max(entry.last_seen, record.emitted_at)
            # An audit delivered again (a restarted worker replays from its last commit) finds its
            # bad cases joined in the recovered state: they are made again (same event ids, which
            # the sinks and the retrain trigger absorb), because the changelog can reach the broker
            # while the bad cases themselves did not (another partition and broker, or a delivery
            # refused, after which the worker stops and its inputs are replayed).
            cases: list[Event] = [self._case(record, fb) for fb in entry.joined_feedback]
            waiting, entry.waiting_feedback = entry.waiting_feedback, []
            cases += [self._join(entry, fb) for fb in waiting]
            self.state[record.request_id] = entry  # write back: a changelogged table logs on set
            self._expiry.touch(record.request_id, record.tenant, entry.last_seen)
            return cases
        if isinstance(record, Feedback):
            if not record.corrected_answer:
                return []
            record = self._redacted_feedback(record)  # before it is kept in the join state
            entry = self.state.get(record.request_id)
            if entry is None:
                entry = JoinEntry()
                self.state[record.request_id] = entry
            entry.last_seen = max(entry.last_seen, record.emitted_at)
            case = None
            if entry.audit is None:
                if all(fb.event_id != record.event_id for fb in entry.waiting_feedback):
                    entry.waiting_feedback.append(record)
            else:
                case = self._join(entry, record)
            self.state[record.request_id] = entry
            self._expiry.touch(record.request_id, entry_tenant(entry), entry.last_seen)
            return [case] if case is not None else []
        return []

    def _join(self, entry: JoinEntry, feedback: Feedback) -> Event:
        """The bad case of ``feedback`` on the entry's audit; a dead letter if another tenant sent it.

        A feedback delivered again gets the same bad case again (see ``process``: the first may
        not have reached the broker), not a second entry in the state."""
        audit = entry.audit
        assert audit is not None
        if not verdict_applies(feedback.tenant, audit.tenant):
            self.refused_other_tenant += 1
            return self.tenant_mismatch(audit, feedback)
        if all(fb.event_id != feedback.event_id for fb in entry.joined_feedback):
            entry.joined_feedback.append(feedback)
        return self._case(audit, feedback)

    def tenant_mismatch(self, audit: Audit | JoinedAudit, feedback: Feedback) -> DeadLetter:
        """The dead letter of a correction on another tenant's answer (same id on redelivery).

        Not remembered in the entry: a redelivery derives the same event id, which the sinks absorb."""
        payload = encode(feedback)  # the correction in it is already redacted (``_redacted_feedback``)
        return derive(
            feedback, DeadLetter, 0, f"{self.name}.tenant_mismatch",
            source_topic=Feedback.topic,
            source_partition=partition_for(feedback.request_id),
            source_offset=0,
            reason=(f"feedback {feedback.event_id} of tenant {feedback.tenant!r} on request {feedback.request_id}, "
                    f"which was served to tenant {audit.tenant!r}: not joined (a tenant may correct only its own "
                    f"answers; source offset unknown to the processor)"),
            error_type="tenant_mismatch",
            payload=payload[:4096],
            payload_size=len(payload),
            payload_sha256=hashlib.sha256(payload).hexdigest(),
        )

    def _redacted_feedback(self, feedback: Feedback) -> Feedback:
        redact = self.redactor.redact_text
        return msgspec.structs.replace(
            feedback, corrected_answer=redact(feedback.corrected_answer), comment=redact(feedback.comment)
        )

    def build(self, audit: Audit, feedback: Feedback) -> BadCase:
        """The bad case of one (audit, feedback) pair; pure, used by the join and by replays.

        Every text is redacted (idempotent: the gateway already redacted the audit's), so no raw
        PII from a correction reaches the BadCase, whoever calls this."""
        return self._case(audit, self._redacted_feedback(feedback))

    def _case(self, audit: Audit | JoinedAudit, feedback: Feedback) -> BadCase:
        """``build`` of a feedback already redacted (``_redacted_feedback``: what the join state
        holds); the audit's texts are redacted again here (idempotent), whoever produced them."""
        redact = self.redactor.redact_text
        response, correction = redact(audit.response), feedback.corrected_answer
        rule_labels = self.rules.compare(response, correction, audit.route)
        span, _ = minimal_failing_span(response, correction)
        confidence = bad_case_confidence(rule_labels, span, response, feedback, self.negative_rating)
        # The user's declared error type is a label too (off_intent, for one, no rule can see).
        declared = feedback.error_type.strip().lower()
        labels = rule_labels + ([declared] if declared and declared not in rule_labels else [])
        labels = labels or [OTHER]
        if confidence >= self.regression_confidence:
            labels = [*labels, REGRESSION_LABEL]
        return derive(
            feedback,
            BadCase,
            0,
            self.name,
            model=audit.model,
            prompt=redact(audit.prompt),
            response=response,
            correction=correction,
            route=audit.route,
            adapter=audit.adapter,
            audit_id=audit.audit_id,
            labels=labels,
            diff=token_diff(response, correction),
            minimal_span=span,
            confidence=confidence,
        )

    def on_watermark(self, event_time: float) -> list[Event]:
        """Forget requests idle for ``ttl_s`` of event time (a feedback that never met its audit
        is counted in ``expired_unjoined``), then, above ``max_requests``, the longest idle of the
        tenant holding the most (counted in ``evicted``; a correction of such an answer waits for an
        audit that does not come, until its TTL). Only the entries dropped are read."""
        horizon = event_time - self.ttl_s
        if len(self._expiry) != len(self.state) or self._full_scan_due is None or event_time >= self._full_scan_due:
            self._expiry.reset((rid, entry_tenant(entry), entry.last_seen) for rid, entry in self.state.items())
            self._full_scan_due = event_time + self.ttl_s
        for rid in self._expiry.expired(horizon):
            entry = self.state.get(rid)
            if entry is None:  # gone with a revoked partition
                continue
            if entry.last_seen >= horizon:  # changed behind the index (recovered): keep it, at its time
                self._expiry.touch(rid, entry_tenant(entry), entry.last_seen)
                continue
            self._forget(rid, entry)
        excess = len(self.state) - self.max_requests
        if excess > 0:
            for rid in self._expiry.evict(excess):
                entry = self.state.get(rid)
                if entry is not None:
                    self._forget(rid, entry)
                    self.evicted += 1
        return []

    def _forget(self, rid: str, entry: JoinEntry) -> None:
        """Drop a request from the table; the corrections waiting for its audit will never join."""
        del self.state[rid]
        self.expired_unjoined += len(entry.waiting_feedback)


__all__ = [
    "REGRESSION_LABEL",
    "BadCaseJoiner",
    "JoinEntry",
    "bad_case_confidence",
    "decode_entry",
    "encode_entry",
    "example_chunks",
    "minimal_failing_span",
    "token_diff",
]
