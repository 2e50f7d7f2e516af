"""Fallback rates per (model, route, tier): 1-minute tumbling and 5-minute hopping windows.

Event time is each record's ``emitted_at``. Both window kinds are built from one set of
per-minute buckets: a 1-minute tumbling window *is* a bucket, and a 5-minute window hopping by
1 minute is the sum of five consecutive buckets, so each event is counted once, not five times.
Windows close when the watermark passes their end plus ``grace_s``; later events are counted in
``late_events`` and dropped (a closed window is never rewritten).

Numerator: ``Fallback`` records keyed by (model, route, from_tier). Denominator: ``Audit``
records (one per served request) keyed by (model, route); the rate of a tier is its fallbacks
over the requests of its (model, route). Tier ``*`` aggregates all tiers.

Outputs:
* window results as ``Health`` records, component ``fallback_rates``, metric ``fallback_rate_1m``
  or ``fallback_rate_5m``, value the rate, labels model/route/tier/window_start/window_end/
  fallbacks/requests (``requests`` may be 0 when audits are missing: value is then 0);
* ``Alert`` rule ``fallback_rate_slo`` when a closed 5-minute window's rate exceeds ``slo_rate``
  with at least ``slo_min_requests`` requests;
* ``Alert`` rule ``fallback_circuit_breaker`` (severity critical) *as soon as* fallbacks in the
  5 minutes ending with the current minute exceed ``circuit_limit``: a breaker must not wait for
  the window to close. It fires once per episode and re-arms when a closed 5-minute window is
  back at or under the limit.
"""

from __future__ import annotations

from collections.abc import Iterable

import msgspec
from entroloop.streams.base import Processor, derive
from entroloop.streams.windowing import synthesize, window_start

from entroloop.contract.records import Alert, Audit, Event, Fallback, Health
from entroloop.contract.settings import Settings

MINUTE = 60.0
HOP_WINDOW_MINUTES = 5
ALL_TIERS = "*"


class FallbackRatesSnapshot(msgspec.Struct, array_like=True):
    """``FallbackRateMonitor``'s state: per-minute counts of the open windows, open breakers."""

    fallbacks: list[tuple[str, str, str, float, int]]  # model, route, tier, minute start, fallbacks
    requests: list[tuple[str, str, float, int]]  # model, route, minute start, requests
    open_breakers: list[tuple[str, str, str]]
    closed_minute: float
    late_events: int


_SNAPSHOT_DECODER = msgspec.msgpack.Decoder(FallbackRatesSnapshot)


class FallbackRateMonitor(Processor):
    """Windowed fallback rates, SLO alerts and a circuit breaker (see the module docstring)."""

    name = "fallback_rates"
    inputs = (Fallback, Audit)
    needs_every_partition = True  # counts over many requests: one worker must see every one

    def __init__(
        self,
        slo_rate: float = 0.05,
        slo_min_requests: int = 50,
        circuit_limit: int = 1000,
        grace_s: float = 5.0,
        sources: Iterable[str] | None = None,
    ) -> None:
        self.slo_rate = slo_rate
        self.slo_min_requests = slo_min_requests
        self.circuit_limit = circuit_limit
        self.grace_s = grace_s
        # Which Fallback.source values count (None: all, gateway and intent alike).
        self.sources = frozenset(sources) if sources is not None else None
        # (model, route, tier) -> {minute_start: fallbacks}
        self.fallbacks: dict[tuple[str, str, str], dict[float, int]] = {}
        # (model, route) -> {minute_start: requests}
        self.requests: dict[tuple[str, str], dict[float, int]] = {}
        self.open_breakers: set[tuple[str, str, str]] = set()
        # Every minute bucket starting before this has been emitted as a 1-minute window.
        self.closed_minute = float("-inf")
        self.late_events = 0

    @classmethod
    def from_settings(cls, settings: Settings) -> FallbackRateMonitor:
        return cls(
            slo_rate=settings.fallback_slo_rate,
            slo_min_requests=settings.fallback_slo_min_requests,
            circuit_limit=settings.fallback_circuit_limit,
            grace_s=settings.window_grace_s,
            sources=settings.fallback_rate_sources or None,
        )

    def snapshot(self) -> bytes:
        return msgspec.msgpack.encode(FallbackRatesSnapshot(
            fallbacks=[(*key, minute, n) for key, minutes in self.fallbacks.items() for minute, n in minutes.items()],
            requests=[(*key, minute, n) for key, minutes in self.requests.items() for minute, n in minutes.items()],
            open_breakers=sorted(self.open_breakers),
            closed_minute=self.closed_minute,
            late_events=self.late_events,
        ))

    def restore(self, snapshot: bytes) -> None:
        state = _SNAPSHOT_DECODER.decode(snapshot)
        self.fallbacks, self.requests = {}, {}
        for model, route, tier, minute, n in state.fallbacks:
            self.fallbacks.setdefault((model, route, tier), {})[minute] = n
        for model, route, minute, n in state.requests:
            self.requests.setdefault((model, route), {})[minute] = n
        self.open_breakers = {tuple(key) for key in state.open_breakers}
        self.closed_minute = state.closed_minute
        self.late_events = state.late_events

    # --- ingest ----------------------------------------------------------------------------------

    def process(self, record: Event) -> list[Event]:
        minute = window_start(record.emitted_at, MINUTE)
        if minute < self.closed_minute:
            self.late_events += 1
            return []
        if isinstance(record, Audit):
            if record.part_index:  # a large audit in parts is one request: count its first part
                return []
            buckets = self.requests.setdefault((record.model, record.route), {})
            buckets[minute] = buckets.get(minute, 0) + 1
            return []
        if isinstance(record, Fallback):
            if self.sources is not None and record.source not in self.sources:
                return []
            out: list[Event] = []
            for tier in (record.from_tier, ALL_TIERS):
                key = (record.model, record.route, tier)
                buckets = self.fallbacks.setdefault(key, {})
                buckets[minute] = buckets.get(minute, 0) + 1
                if key in self.open_breakers:
                    continue
                in_window = sum(
                    buckets.get(minute - i * MINUTE, 0) for i in range(HOP_WINDOW_MINUTES)
                )
                if in_window > self.circuit_limit:
                    self.open_breakers.add(key)
                    out.append(self._breaker_alert(record, key, minute, in_window, len(out)))
            return out
        return []

    def _breaker_alert(
        self, record: Fallback, key: tuple[str, str, str], minute: float, count: int, index: int
    ) -> Alert:
        model, route, tier = key
        start = minute - (HOP_WINDOW_MINUTES - 1) * MINUTE
        return derive(
            record,
            Alert,
            index,
            self.name,
            alert_key=f"fallback_circuit_breaker:{model}:{route}:{tier}:{start:.0f}",
            rule="fallback_circuit_breaker",
            severity="critical",
            model=model,
            route=route,
            value=float(count),
            threshold=float(self.circuit_limit),
            detail=f"{count} fallbacks from tier {tier} in the 5 minutes from {start:.0f} "
            f"exceed the circuit-breaker limit {self.circuit_limit}",
            source_event_id=record.event_id,
        )

    # --- close -----------------------------------------------------------------------------------

    def on_watermark(self, event_time: float) -> list[Event]:
        """Close every minute whose end is at least ``grace_s`` behind ``event_time``."""
        horizon = event_time - self.grace_s
        minutes = {m for b in self.fallbacks.values() for m in b} | {
            m for b in self.requests.values() for m in b
        }
        # A 5-minute window ending at minute m+1 needs the four buckets before m: close them in
        # order, including empty minutes after data, so hopping windows slide past the data.
        to_close = sorted(
            {m + i * MINUTE for m in minutes for i in range(HOP_WINDOW_MINUTES)}
            if minutes
            else set()
        )
        out: list[Event] = []
        for minute in to_close:
            if minute + MINUTE > horizon or minute < self.closed_minute:
                continue
            out.extend(self._close_minute(minute))
        if to_close:
            new_closed = max((m + MINUTE for m in to_close if m + MINUTE <= horizon), default=None)
            if new_closed is not None:
                self.closed_minute = max(self.closed_minute, new_closed)
        self._forget_before(self.closed_minute - (HOP_WINDOW_MINUTES - 1) * MINUTE)
        return out

    def _close_minute(self, minute: float) -> list[Event]:
        out: list[Event] = []
        first = minute - (HOP_WINDOW_MINUTES - 1) * MINUTE
        hop_minutes = [first + i * MINUTE for i in range(HOP_WINDOW_MINUTES)]
        keys = set(self.fallbacks) | self.open_breakers  # an open breaker must see its windows to re-arm
        # (model, route) pairs with requests but no fallback still get a rate of 0 on tier "*".
        keys |= {(model, route, ALL_TIERS) for model, route in self.requests}
        for key in sorted(keys):
            model, route, tier = key
            fb_buckets = self.fallbacks.get(key, {})
            rq_buckets = self.requests.get((model, route), {})
            fb_1 = fb_buckets.get(minute, 0)
            rq_1 = rq_buckets.get(minute, 0)
            fb_5 = sum(fb_buckets.get(m, 0) for m in hop_minutes)
            rq_5 = sum(rq_buckets.get(m, 0) for m in hop_minutes)
            series = f"{self.name}/{model}/{route}/{tier}"
            end = minute + MINUTE
            if fb_1 or rq_1:
                out.append(self._window_record(series, "fallback_rate_1m", minute, end, fb_1, rq_1, key))
            if key in self.open_breakers and fb_5 <= self.circuit_limit:
                self.open_breakers.discard(key)  # re-arm: the episode is over
            if fb_5 or rq_5:
                out.append(self._window_record(series, "fallback_rate_5m", first, end, fb_5, rq_5, key))
                rate = fb_5 / rq_5 if rq_5 else 0.0
                if rq_5 >= self.slo_min_requests and rate > self.slo_rate:
                    out.append(
                        synthesize(
                            Alert,
                            self.name,
                            series,
                            end,
                            2,
                            alert_key=f"fallback_rate_slo:{model}:{route}:{tier}:{first:.0f}",
                            rule="fallback_rate_slo",
                            severity="warning",
                            model=model,
                            route=route,
                            value=rate,
                            threshold=self.slo_rate,
                            detail=f"fallback rate {rate:.2%} ({fb_5}/{rq_5}) from tier {tier} in "
                            f"[{first:.0f}, {end:.0f}) exceeds the SLO {self.slo_rate:.2%}",
                        )
                    )
        return out

    def _window_record(
        self,
        series: str,
        metric: str,
        start: float,
        end: float,
        fallbacks: int,
        requests: int,
        key: tuple[str, str, str],
    ) -> Health:
        model, route, tier = key
        return synthesize(
            Health,
            self.name,
            series,
            end,
            0 if metric.endswith("1m") else 1,
            component=self.name,
            metric=metric,
            value=fallbacks / requests if requests else 0.0,
            labels={
                "model": model,
                "route": route,
                "tier": tier,
                "window_start": f"{start:.0f}",
                "window_end": f"{end:.0f}",
                "fallbacks": str(fallbacks),
                "requests": str(requests),
            },
        )

    def _forget_before(self, minute: float) -> None:
        """Drop buckets no open 5-minute window still needs."""
        for table in (self.fallbacks, self.requests):
            for key in list(table):
                buckets = table[key]
                for m in [m for m in buckets if m < minute]:
                    del buckets[m]
                if not buckets:
                    del table[key]


__all__ = ["FallbackRateMonitor", "ALL_TIERS"]
