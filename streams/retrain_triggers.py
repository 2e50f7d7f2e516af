"""Retrain triggers: ask for one incremental fine-tune per (model, adapter, category, window).

A category is a bad-case label (``number``, ``fact``, ``amount_format``, ``unit``, ``date``,
``json_schema``, ``compliance``, ``other``; the ``regression`` flag is not a category). Windows
are event-time tumbling windows of ``window_s`` (an hour by default), aligned to the epoch, so a
trigger key is the same on every replay. Two conditions, one key space:

* count: the ``bad_case_count``-th high-confidence bad case of a category in the window fires at
  once (no need to wait for the hour to end);
* rate: bad cases of a category per audited request of the (model, adapter) in the window exceed
  ``error_rate`` with at least ``min_requests`` requests. Checked on each bad case once enough
  requests are in, and again when the window closes.

Whichever fires first emits the ``RetrainRequest``; ``emitted`` remembers every key, so the
other condition, a redelivered bad case or a replay never emits a second one for the same key.

A bad case counted in an open window is remembered by a 64-bit fingerprint of its event id (a
redelivery must not count twice), not the id itself: the whole state goes into one snapshot record
after every batch (``entroloop.streams.aggregate_snapshots``), which the broker takes up to 1 MB.
Ids as strings cost ~47 bytes a bad case there (1 MB near 6 bad cases a second for an hour);
fingerprints grouped by window cost 9 (near 30 a second). Two ids of one window share a
fingerprint with odds of n²/2⁶⁵: ~3 in 10¹⁰ at 100,000 bad cases an hour.
"""

from __future__ import annotations

import hashlib

import msgspec
from entroloop.streams.base import Processor
from entroloop.streams.windowing import synthesize, window_start

from entroloop.contract.records import Audit, BadCase, Event, RetrainRequest
from entroloop.contract.settings import Settings

NOT_CATEGORIES = frozenset({"regression"})


class RetrainTriggersSnapshot(msgspec.Struct, array_like=True):
    """``RetrainTrigger``'s state: the open windows' counts, the keys already triggered, the bad
    cases already counted."""

    requests: list[tuple[str, str, float, int]]  # model, adapter, window start, audited requests
    bad_cases: list[tuple[str, str, str, float, int, int]]  # ... category, window start, bad cases, high-confidence
    emitted: dict[str, float]
    # window end -> fingerprints of the bad cases counted in it; a dict of event id -> window end
    # in snapshots written before fingerprints (read, converted)
    seen_bad_cases: list[tuple[float, list[int]]] | dict[str, float]
    closed_until: float
    late_events: int


_SNAPSHOT_DECODER = msgspec.msgpack.Decoder(RetrainTriggersSnapshot)


def fingerprint(event_id: str) -> int:
    """64 bits of BLAKE2b over the event id: what the dedup of counted bad cases keeps."""
    return int.from_bytes(hashlib.blake2b(event_id.encode(), digest_size=8).digest(), "big")


class RetrainTrigger(Processor):
    """Emit ``RetrainRequest`` records from ``BadCase`` counts and ``Audit`` request counts."""

    name = "retrain_triggers"
    inputs = (BadCase, Audit)
    needs_every_partition = True  # counts over many requests: one worker must see every one

    def __init__(
        self,
        error_rate: float = 0.05,
        min_requests: int = 100,
        bad_case_count: int = 20,
        high_confidence: float = 0.8,
        window_s: float = 3600.0,
        grace_s: float = 5.0,
        key_retention_s: float = 30 * 86_400,
    ) -> None:
        self.error_rate = error_rate
        self.min_requests = min_requests
        self.bad_case_count = bad_case_count
        self.high_confidence = high_confidence
        self.window_s = window_s
        self.grace_s = grace_s
        self.key_retention_s = key_retention_s
        # (model, adapter, window_start) -> audited requests
        self.requests: dict[tuple[str, str, float], int] = {}
        # (model, adapter, category, window_start) -> [bad cases, high-confidence bad cases]
        self.bad_cases: dict[tuple[str, str, str, float], list[int]] = {}
        # trigger key -> window end; kept key_retention_s so a replay cannot trigger again.
        self.emitted: dict[str, float] = {}
        # fingerprints of the bad cases counted in open windows -> window end (redelivery must not
        # count twice).
        self.seen_bad_cases: dict[int, float] = {}
        self.closed_until = float("-inf")
        self.late_events = 0

    @classmethod
    def from_settings(cls, settings: Settings) -> RetrainTrigger:
        return cls(
            error_rate=settings.retrain_error_rate,
            min_requests=settings.retrain_min_requests,
            bad_case_count=settings.retrain_bad_case_count,
            high_confidence=settings.badcase_regression_confidence,
            window_s=settings.retrain_window_s,
            grace_s=settings.window_grace_s,
        )

    def snapshot(self) -> bytes:
        seen_by_window: dict[float, list[int]] = {}
        for seen, end in self.seen_bad_cases.items():
            seen_by_window.setdefault(end, []).append(seen)
        return msgspec.msgpack.encode(RetrainTriggersSnapshot(
            requests=[(*key, n) for key, n in self.requests.items()],
            bad_cases=[(*key, counts[0], counts[1]) for key, counts in self.bad_cases.items()],
            emitted=self.emitted,
            seen_bad_cases=list(seen_by_window.items()),
            closed_until=self.closed_until,
            late_events=self.late_events,
        ))

    def restore(self, snapshot: bytes) -> None:
        state = _SNAPSHOT_DECODER.decode(snapshot)
        self.requests = {(model, adapter, start): n for model, adapter, start, n in state.requests}
        self.bad_cases = {(model, adapter, category, start): [n, confident]
                          for model, adapter, category, start, n, confident in state.bad_cases}
        self.emitted = state.emitted
        if isinstance(state.seen_bad_cases, dict):
            self.seen_bad_cases = {fingerprint(event_id): end for event_id, end in state.seen_bad_cases.items()}
        else:
            self.seen_bad_cases = {seen: end for end, window in state.seen_bad_cases for seen in window}
        self.closed_until = state.closed_until
        self.late_events = state.late_events

    @staticmethod
    def trigger_key(model: str, adapter: str, category: str, start: float, window_s: float) -> str:
        return f"{model}|{adapter}|{category}|{start:.0f}+{window_s:.0f}"

    def process(self, record: Event) -> list[Event]:
        start = window_start(record.emitted_at, self.window_s)
        if start + self.window_s <= self.closed_until:
            self.late_events += 1
            return []
        if isinstance(record, Audit):
            if record.part_index:  # a large audit in parts is one request: count its first part
                return []
            key = (record.model, record.adapter, start)
            self.requests[key] = self.requests.get(key, 0) + 1
            return []
        if not isinstance(record, BadCase):
            return []
        seen = fingerprint(record.event_id)
        if seen in self.seen_bad_cases:
            return []
        self.seen_bad_cases[seen] = start + self.window_s
        out: list[Event] = []
        high = record.confidence >= self.high_confidence
        categories = [c for c in dict.fromkeys(record.labels) if c not in NOT_CATEGORIES] or ["other"]
        for category in categories:
            counts = self.bad_cases.setdefault((record.model, record.adapter, category, start), [0, 0])
            counts[0] += 1
            counts[1] += int(high)
            requests = self.requests.get((record.model, record.adapter, start), 0)
            reason = None
            if counts[1] >= self.bad_case_count:
                reason = f"{counts[1]} high-confidence bad cases (>= {self.bad_case_count})"
            elif requests >= self.min_requests and counts[0] / requests > self.error_rate:
                reason = self._rate_reason(counts[0], requests)
            if reason:
                request = self._emit(record.model, record.adapter, category, start, counts, reason, len(out))
                if request is not None:
                    out.append(request)
        return out

    def _rate_reason(self, bad: int, requests: int) -> str:
        return f"error rate {bad / requests:.2%} ({bad}/{requests}) above {self.error_rate:.2%}"

    def _emit(
        self,
        model: str,
        adapter: str,
        category: str,
        start: float,
        counts: list[int],
        reason: str,
        index: int,
    ) -> RetrainRequest | None:
        key = self.trigger_key(model, adapter, category, start, self.window_s)
        if key in self.emitted:
            return None
        end = start + self.window_s
        self.emitted[key] = end
        # The id depends on the key only, so the same trigger reached by another path (rate at
        # close instead of count) would still be the same record: belt and braces with `emitted`.
        return synthesize(
            RetrainRequest,
            self.name,
            key,
            end,
            0,
            trigger_key=key,
            model=model,
            adapter=adapter,
            category=category,
            reason=reason,
            window_start=start,
            window_end=end,
            bad_case_count=counts[0],
        )

    def on_watermark(self, event_time: float) -> list[Event]:
        """Close windows ending ``grace_s`` before ``event_time``: final rate check, then forget."""
        horizon = event_time - self.grace_s
        out: list[Event] = []
        for key in sorted(k for k in self.bad_cases if k[3] + self.window_s <= horizon):
            model, adapter, category, start = key
            counts = self.bad_cases.pop(key)
            requests = self.requests.get((model, adapter, start), 0)
            if requests >= self.min_requests and counts[0] / requests > self.error_rate:
                request = self._emit(
                    model, adapter, category, start, counts, self._rate_reason(counts[0], requests), 0
                )
                if request is not None:
                    out.append(request)
        for key in [k for k in self.requests if k[2] + self.window_s <= horizon]:
            del self.requests[key]
        for seen in [e for e, end in self.seen_bad_cases.items() if end <= horizon]:
            del self.seen_bad_cases[seen]
        for key in [k for k, end in self.emitted.items() if end + self.key_retention_s <= horizon]:
            del self.emitted[key]
        self.closed_until = max(self.closed_until, horizon)
        return out


__all__ = ["RetrainTrigger"]
