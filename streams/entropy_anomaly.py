"""Entropy anomalies: repetition loops (long runs of very low entropy) and gibberish (runs of very
high entropy) in one request's per-token entropies.

A model stuck in a loop is nearly certain of every next token, so entropy stays far below its
normal band; a model emitting gibberish is nearly uniform over many tokens. One isolated token of
either kind is normal (a forced closing bracket, a name), so a rule needs a *run* of
``min_run`` consecutive tokens. Long generations arrive in chunks (4096 tokens, minutes apart);
an open run at the end of a non-final chunk is carried to the next chunk so a loop spanning the
boundary is one alert, and a request whose final chunk never comes becomes an
``incomplete_request`` dead letter ``incomplete_ttl_s`` of event time after its last chunk.

That carry lives in ``state``: one ``EntropyCarry`` per request id, written by each chunk of a
multi-chunk request (a single-chunk request only looks its key up and finds nothing). Under the
Faust worker ``state`` is a changelogged table (``table_state``, ``entroloop.streams.table_state``),
co-partitioned with the token topic, so the carry is durable: it survives a worker restart
(SIGKILL, deploy) or a rebalance that moves the request's partition to another worker between two
chunks. In the embedded runner it is a plain dict.

Delivery is at-least-once, so the latest chunk of a request can come again (a worker that died
before committing it; Faust also hands prefetched records over a second time after a table
recovery). The carry remembers the runs each chunk joined, so a redelivered chunk yields the same
alerts and leaves the carry as it was; for that, the final chunk leaves a small ``finished`` entry
instead of deleting the key, and the TTL drops it (a tombstone under Faust) without a dead letter.

With ``evidence`` (``Settings.entropy_evidence``, on by default through ``from_settings``) a static
run is only a candidate: streams/entropy_evidence.py confirms a loop by periodic repetition (token
ids when the record carries them, else the entropy sequence) and gibberish by a sustained level
above the (model, route)'s own band, learned from the requests this detector did not flag. The
alert's ``baseline`` is then a JSON object naming the evidence. A run spanning chunks is judged on
the tokens of the chunk that closes it (earlier chunks' tokens are not carried). The bands live in
the worker's memory, not in the carry table: a restarted worker relearns them in tens of requests,
and a redelivered record may be learned twice (one request more in a quantile sketch).
"""

from __future__ import annotations

import json
from collections.abc import MutableMapping, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import ClassVar

import msgspec
import numpy as np
from entroloop.streams.base import Processor, derive
from entroloop.streams.entropy_evidence import EntropyEvidence
from entroloop.streams.periodicity import Stretch, periodic_stretches
from entroloop.streams.table_state import TableStateSpec

from entroloop.contract.codec import decode, encode
from entroloop.contract.records import Alert, DeadLetter, Event, TokenEntropy
from entroloop.contract.settings import Settings
from entroloop.contract.topics import partition_for

LOOP = "repetition_loop"
GIBBERISH = "gibberish"


@dataclass(frozen=True)
class RunRule:
    name: str
    threshold: float
    min_run: int
    below: bool
    """True: tokens strictly below the threshold count; False: tokens strictly above it."""

    def mask(self, values: np.ndarray) -> np.ndarray:
        return values < self.threshold if self.below else values > self.threshold


class OpenRun(msgspec.Struct, array_like=True):
    """A run still open at the end of a non-final chunk: absolute start, length and value sum."""

    start: int
    length: int
    total: float


class EntropyCarry(msgspec.Struct):
    """What one request carries from its latest chunk to the next (the ``state`` value)."""

    next_chunk: int
    """The chunk the open runs continue into; another chunk index does not join them."""
    last_emitted_at: float
    """Event time of the latest chunk: the TTL counts from it."""
    last_chunk: bytes = b""
    """The latest chunk, encoded (``entroloop.contract.codec``), while the request is unfinished: the
    incomplete-request dead letter is derived from it and carries it as its payload."""
    open_runs: dict[str, OpenRun] = {}
    """Rule name -> run open at the end of the latest chunk."""
    joined: dict[int, dict[str, OpenRun]] = {}
    """Chunk index -> rule name -> run carried into that chunk (chunks that joined none are left
    out): a redelivered chunk joins the same runs again, so it yields the same alerts."""
    finished: bool = False
    """The latest chunk was the final one: kept until the TTL only for a redelivery, then
    dropped without a dead letter."""


CARRY_STATE: TableStateSpec[EntropyCarry] = TableStateSpec.msgpack("entropy_carry", EntropyCarry, key_of=attrgetter("request_id"))
encode_carry = CARRY_STATE.encode
"""Table value serializer (changelog bytes)."""
decode_carry = CARRY_STATE.decode


class EntropyAnomalyDetector(Processor):
    """Emits one ``Alert`` per loop or gibberish run of at least ``min_run`` tokens."""

    name = "entropy_anomaly"
    inputs = (TokenEntropy,)
    # Under Faust, ``state`` is this changelogged table (entroloop.streams.table_state): the carry between
    # two chunks of a request survives a worker restart or rebalance. TTL expiry deletes entries,
    # which writes tombstones, so recovery drops them too.
    table_state: ClassVar[TableStateSpec[EntropyCarry]] = CARRY_STATE

    def __init__(
        self,
        loop_threshold: float = 1.5,
        loop_min_run: int = 5,
        gibberish_threshold: float = 4.5,
        gibberish_min_run: int = 5,
        incomplete_ttl_s: float = 600.0,
        state: MutableMapping[str, EntropyCarry] | None = None,
        evidence: EntropyEvidence | None = None,
    ) -> None:
        self.rules = (
            RunRule(LOOP, loop_threshold, loop_min_run, below=True),
            RunRule(GIBBERISH, gibberish_threshold, gibberish_min_run, below=False),
        )
        # A request whose final chunk never comes becomes a dead letter once event time is
        # incomplete_ttl_s past its latest chunk.
        self.incomplete_ttl_s = incomplete_ttl_s
        # request_id -> EntropyCarry of a multi-chunk request, until the TTL. A Faust table
        # (with changelog) can stand in for this dict: an entry is only ever replaced whole
        # (``state[key] = carry``), never changed in place, so the table sees every change.
        self.state: MutableMapping[str, EntropyCarry] = state if state is not None else {}
        # None: the static rules alone (every run of min_run tokens is an alert).
        self.evidence = evidence

    @classmethod
    def from_settings(cls, settings: Settings) -> EntropyAnomalyDetector:
        return cls(
            loop_threshold=settings.loop_threshold_nats,
            loop_min_run=settings.loop_min_run,
            gibberish_threshold=settings.gibberish_threshold_nats,
            gibberish_min_run=settings.gibberish_min_run,
            incomplete_ttl_s=settings.incomplete_request_ttl_s,
            evidence=EntropyEvidence.from_settings(settings) if settings.entropy_evidence else None,
        )

    def process(self, record: Event) -> list[Event]:
        return self.process_batch([record])

    def process_batch(self, records: Sequence[Event]) -> list[Event]:
        """Find runs for a whole micro-batch in a few vectorised passes over all its tokens.

        Per-record numpy calls cost more than the arithmetic at typical lengths, so the batch's
        entropies are concatenated and runs are found once, never crossing a record's edge.
        """
        if not records:
            return []
        arrays = [r.values() for r in records]  # type: ignore[attr-defined]
        bounds = np.zeros(len(arrays) + 1, dtype=np.int64)
        np.cumsum([a.size for a in arrays], out=bounds[1:])
        flat = np.concatenate(arrays).astype(np.float32)
        sums = np.concatenate(([0.0], np.cumsum(flat, dtype=np.float64)))
        per_record: list[dict[str, list[tuple[int, int, float]]]] = [{} for _ in records]
        for rule in self.rules:
            for i, start, end in self._candidate_runs(rule, flat, bounds):
                base = bounds[i]
                per_record[i].setdefault(rule.name, []).append(
                    (int(start - base), int(end - base), float(sums[end] - sums[start]))
                )
        alerts: list[Event] = []
        state = self.state
        periodic, by_ids = self._periodic_loops(records, arrays)
        for index, (record, runs) in enumerate(zip(records, per_record)):
            assert isinstance(record, TokenEntropy)
            request_id = record.request_id
            surprisals = record.surprisal_values() if self.evidence is not None else None
            sampling = record.sampling_values() if self.evidence is not None else None
            # The common single-chunk request: one lookup that misses, no write.
            carry = state.get(request_id)
            if (carry is None and record.final and not runs and index not in periodic and surprisals is None
                    and sampling is None):
                if self.evidence is not None:
                    self.evidence.learn_if_normal(record.model, record.route, arrays[index], [])
                continue
            carried = self._carried_into(record, carry)
            still_open: dict[str, OpenRun] = {}
            found: list[Event] = []
            for rule in self.rules:
                # With token ids, whether the tokens repeat decides a loop (at any entropy: a real
                # model's loops run at its ordinary level), so the low-entropy rule is not consulted.
                if rule.below and index in by_ids:
                    continue
                closed = self._close_runs(record, rule, runs.get(rule.name, []), carried.get(rule.name), still_open)
                for start, end, total in closed:
                    if end - start < rule.min_run:
                        continue
                    evidence = self._confirm(record, arrays[index], rule, start, end)
                    if evidence is False:
                        continue
                    found.append(self._alert(record, rule, start, end, total / (end - start), len(found), evidence))
            if index in periodic:
                found.extend(self._periodic_alert(record, arrays[index], periodic[index], index in by_ids, found))
            if surprisals is not None:  # in addition: a lost model sampled at T=1 is gibberish at excess 0
                found.extend(self._excess_alert(record, arrays[index], surprisals, "surprisal", found))
            if sampling is not None:  # the same question without token ids: how hot is the sampler
                found.extend(self._excess_alert(record, arrays[index], sampling, "sampling_entropy", found))
            alerts.extend(found)
            if carry is not None and record.chunk_index < carry.next_chunk:
                continue  # a redelivered chunk: it changes nothing the first delivery did not
            if self.evidence is not None:
                self.evidence.learn_if_normal(record.model, record.route, arrays[index], found)
            if not record.final or carry is not None:
                joined = carry.joined if carry is not None else {}
                if carried:
                    joined = {**joined, record.chunk_index: carried}
                # The final chunk does not delete: a redelivered final chunk (a worker that died
                # before committing it, or Faust handing prefetched records over again after a
                # recovery) must join the same runs, or it republishes its alert's event id with a
                # wrong start. The finished entry is small (no chunk bytes) and lives until the TTL.
                state[request_id] = EntropyCarry(
                    next_chunk=record.chunk_index + 1,
                    last_emitted_at=record.emitted_at,
                    last_chunk=b"" if record.final else encode(record),
                    open_runs=still_open,
                    joined=joined,
                    finished=record.final,
                )
        return alerts

    def _periodic_loops(self, records: Sequence[Event], arrays: list[np.ndarray]) -> tuple[dict[int, Stretch], set[int]]:
        """Record index -> its longest periodic stretch, at any entropy level; and the indexes of
        the records that carry token ids. Token ids when the record has them (exact repetition);
        else the entropy sequence, repeating within the tolerances with some spread (a flat
        sequence repeats trivially: that case is left to the low-entropy rule and its evidence)."""
        if self.evidence is None:
            return {}, set()
        c = self.evidence.config
        hashes = [r.hashes() for r in records]  # type: ignore[attr-defined]
        by_ids = {i for i, h in enumerate(hashes) if h is not None}
        found: dict[int, Stretch] = {}
        for members, tolerance in ((sorted(by_ids), None),
                                   ([i for i in range(len(records)) if i not in by_ids],
                                    (c.loop_entropy_repeat_tolerance_nats, 0.0))):
            if not members:
                continue
            parts = [hashes[i] if tolerance is None else arrays[i] for i in members]
            bounds = np.zeros(len(parts) + 1, dtype=np.int64)
            np.cumsum([p.size for p in parts], out=bounds[1:])
            recurring: list[int] = []
            stretches = periodic_stretches(
                np.concatenate(parts), bounds, c.loop_max_period, c.loop_min_repeats,
                c.loop_min_tokens if tolerance is None else c.loop_min_tokens_entropy_only,
                tolerance=tolerance, min_spread=0.0 if tolerance is None else c.loop_entropy_min_spread_nats,
                recurring=recurring,
            )
            found.update({members[k]: stretch for k, stretch in stretches.items()})
            # token ids: a loop that repeats with changes has no exact period (lookback 0: not looked for)
            if tolerance is None and c.loop_template_lookback:
                for k in recurring:
                    if k not in stretches:
                        near = self.evidence.near_cycle(parts[k])
                        if near is not None:
                            found[members[k]] = Stretch(members[k], near.distance, near.start, near.end,
                                                        near.copied_share)
        return found, by_ids

    def _periodic_alert(self, record: TokenEntropy, values: np.ndarray, stretch: Stretch, by_ids: bool,
                        found: list[Event]) -> list[Alert]:
        """The loop alert of a periodic stretch, unless a loop alert of this chunk already covers it
        (entropies alone: the low-entropy rule may have confirmed the same loop)."""
        assert self.evidence is not None
        offset = record.first_token_index
        start, end = offset + stretch.start, offset + stretch.end
        if any(isinstance(a, Alert) and a.rule == LOOP and a.token_start < end and start < a.token_end for a in found):
            return []
        source = "near_cycle" if stretch.copied_share is not None else "token_ids" if by_ids else "entropy_periodicity"
        evidence = {"rule": LOOP, "static": None,
                    **self.evidence.periodic_loop(record.model, record.route, values, stretch, offset, source)}
        minimum = self.evidence.config.loop_min_tokens if by_ids else self.evidence.config.loop_min_tokens_entropy_only
        if stretch.copied_share is not None:
            detail = (f"{stretch.length} tokens keep copying the text {stretch.period} tokens back x{evidence['repeats']} "
                      f"({stretch.copied_share:.0%} of them inside a copied {self.evidence.config.loop_template_ngram}-gram: "
                      f"a cycle that repeats with changes) at mean entropy {evidence['stretch_mean']:.2f} nats")
        else:
            detail = (f"{stretch.length} tokens repeat with period {stretch.period} x{evidence['repeats']} "
                      f"({'token ids' if by_ids else 'entropy sequence'}; >= {minimum} tokens needed) at mean entropy "
                      f"{evidence['stretch_mean']:.2f} nats")
        return [self._make_alert(record, LOOP, len(found), start, end, float(stretch.length), float(minimum),
                                 evidence, detail)]

    def _excess_alert(self, record: TokenEntropy, values: np.ndarray, other: np.ndarray, kind: str,
                      found_so_far: list[Event]) -> list[Alert]:
        """The gibberish alert of a stretch where ``other`` (the sampled tokens' surprisals, or the
        entropies at the sampling temperature) keeps exceeding the model's entropy, unless a
        gibberish alert of this chunk already covers it."""
        assert self.evidence is not None
        offset = record.first_token_index
        judge = self.evidence.judge_surprisal if kind == "surprisal" else self.evidence.judge_sampling
        judged = judge(record.model, record.route, values, other, offset)
        if judged is None:
            return []
        start, end, found = judged
        first, last = offset + start, offset + end
        if any(isinstance(a, Alert) and a.rule == GIBBERISH and a.token_start < last and first < a.token_end
               for a in found_so_far):
            return []
        index = len(found_so_far)
        evidence = {"rule": GIBBERISH, "static": None, **found}
        what = ("sampled tokens {level} nats more surprising than the model's entropy" if kind == "surprisal"
                else "sampling distribution {level} nats flatter than the model's own").format(level=found["level"])
        detail = (f"{what} (rolling median over {found['window']} tokens; edge {found['edge']}): mean "
                  f"{kind.replace('_', ' ')} {found['stretch_' + kind]:.2f} vs entropy {found['stretch_entropy']:.2f} nats")
        return [self._make_alert(record, GIBBERISH, index, offset + start, offset + end, found["level"],
                                 found["edge"], evidence, detail)]

    def _make_alert(self, record: TokenEntropy, rule: str, index: int, start: int, end: int, value: float,
                    threshold: float, evidence: dict[str, object], detail: str) -> Alert:
        return derive(
            record, Alert, index, self.name,
            alert_key=f"{rule}:{record.request_id}:{start}",
            rule=rule, severity="warning", model=record.model, route=record.route,
            subject_node=record.node_id, token_start=start, token_end=end,
            value=round(value, 4), threshold=threshold,
            baseline=json.dumps(evidence, separators=(",", ":"), sort_keys=True),
            detail=detail, source_event_id=record.event_id,
        )

    def _confirm(self, record: TokenEntropy, values: np.ndarray, rule: RunRule, start: int,
                 end: int) -> dict[str, object] | None | bool:
        """The evidence confirming the closed run [start, end) (absolute), None under the static rules
        alone, or False when the evidence mode finds the run normal."""
        if self.evidence is None:
            return None
        offset = record.first_token_index
        local_start, local_end = max(start - offset, 0), end - offset
        if local_end - local_start <= 0:
            return False  # nothing of the run in this chunk to judge
        if rule.below:
            found = self.evidence.judge_loop(record.model, record.route, values, record.hashes(),
                                             local_start, local_end, offset)
        else:
            found = self.evidence.judge_gibberish(record.model, record.route, values, local_start, local_end,
                                                  rule.threshold)
        if found is None:
            return False
        return {"rule": rule.name, "static": self._static_label(rule), **found}

    @staticmethod
    def _static_label(rule: RunRule) -> str:
        return f"static:{'<' if rule.below else '>'}{rule.threshold}x{rule.min_run}"

    @staticmethod
    def _carried_into(record: TokenEntropy, carry: EntropyCarry | None) -> dict[str, OpenRun]:
        """Rule name -> run the chunk continues: the runs open at the end of the previous chunk, or,
        for a redelivered chunk (an index already seen: chunks of one request come in order), the
        runs it joined the first time. A chunk after a gap is judged on its own rather than joined
        to the wrong tokens."""
        if carry is None:
            return {}
        if record.chunk_index == carry.next_chunk and not carry.finished:
            return carry.open_runs
        if record.chunk_index < carry.next_chunk:
            return carry.joined.get(record.chunk_index, {})
        return {}

    @staticmethod
    def _candidate_runs(rule: RunRule, flat: np.ndarray, bounds: np.ndarray) -> list[tuple[int, int, int]]:
        """(record index, start, end) in batch coordinates of runs that can matter: long enough,
        or touching a record edge (a chunked generation may continue them)."""
        mask = rule.mask(flat)
        if not mask.any():
            return []
        first, last = bounds[:-1], bounds[1:] - 1
        nonempty = bounds[1:] > bounds[:-1]
        starts_mask = mask.copy()
        starts_mask[1:] &= ~mask[:-1]
        starts_mask[first[nonempty]] = mask[first[nonempty]]
        ends_mask = mask.copy()
        ends_mask[:-1] &= ~mask[1:]
        ends_mask[last[nonempty]] = mask[last[nonempty]]
        starts = np.flatnonzero(starts_mask)
        ends = np.flatnonzero(ends_mask) + 1
        index = np.searchsorted(bounds, starts, side="right") - 1
        keep = (ends - starts >= rule.min_run) | (starts == bounds[index]) | (ends == bounds[index + 1])
        return list(zip(index[keep].tolist(), starts[keep].tolist(), ends[keep].tolist()))

    @staticmethod
    def _close_runs(
        record: TokenEntropy,
        rule: RunRule,
        runs: list[tuple[int, int, float]],
        carried: OpenRun | None,
        still_open: dict[str, OpenRun],
    ) -> list[tuple[int, int, float]]:
        """Absolute [start, end) runs closed by this chunk, joining ``carried`` (the rule's run open
        at the end of the previous chunk); a run open at the end of a non-final chunk goes to
        ``still_open`` instead."""
        n = record.n_tokens
        offset = record.first_token_index
        closed: list[tuple[int, int, float]] = []
        for i, (start, end, total) in enumerate(runs):
            abs_start, abs_end = offset + start, offset + end
            if i == 0 and start == 0 and carried is not None:
                abs_start, total = carried.start, total + carried.total
                carried = None
            if end == n and not record.final:
                still_open[rule.name] = OpenRun(abs_start, abs_end - abs_start, total)
                continue
            closed.append((abs_start, abs_end, total))
        if carried is not None:  # the carried run ended exactly at the previous chunk boundary
            closed.insert(0, (carried.start, carried.start + carried.length, carried.total))
        return closed

    def on_watermark(self, event_time: float) -> list[Event]:
        """Requests whose final chunk has not come within the TTL: a dead letter each, state dropped
        (and that of finished requests, kept for a redelivery of their final chunk)."""
        ttl = self.incomplete_ttl_s
        expired = [rid for rid, carry in self.state.items() if carry.last_emitted_at + ttl < event_time]
        out: list[Event] = []
        for request_id in expired:
            carry = self.state.pop(request_id)
            if carry.finished:
                continue
            payload = carry.last_chunk
            last = decode(payload)
            assert isinstance(last, TokenEntropy)
            out.append(derive(
                last, DeadLetter, 0, f"{self.name}.incomplete",
                source_topic=TokenEntropy.topic,
                source_partition=partition_for(last.request_id),
                source_offset=0,
                reason=f"request {last.request_id} never completed: chunk {last.chunk_index} "
                f"(tokens {last.first_token_index}..{last.first_token_index + last.n_tokens}) was the last, "
                f"no final chunk within {self.incomplete_ttl_s:.0f} s (source offset unknown to the processor)",
                error_type="incomplete_request",
                payload=payload[:4096],
                payload_size=len(payload),
            ))
        return out

    def _alert(self, record: TokenEntropy, rule: RunRule, start: int, end: int, mean: float, index: int,
               evidence: dict[str, object] | None = None) -> Alert:
        detail = (f"{end - start} consecutive tokens {'below' if rule.below else 'above'} "
                  f"{rule.threshold} nats (mean {mean:.2f})")
        if evidence is not None and "period" in evidence:
            detail += (f"; repeats with period {evidence['period']} x{evidence['repeats']} "
                       f"({'token ids' if evidence['evidence'] == 'token_ids' else 'entropy sequence'})")
        elif evidence is not None:
            detail += f"; sustained {evidence['level']} nats > {evidence['edge']} ({evidence['evidence']})"
        return derive(
            record,
            Alert,
            index,
            self.name,
            alert_key=f"{rule.name}:{record.request_id}:{start}",
            rule=rule.name,
            severity="warning",
            model=record.model,
            route=record.route,
            subject_node=record.node_id,
            token_start=start,
            token_end=end,
            value=round(mean, 4),
            threshold=rule.threshold,
            baseline=self._static_label(rule) if evidence is None
            else json.dumps(evidence, separators=(",", ":"), sort_keys=True),
            detail=detail,
            source_event_id=record.event_id,
        )
