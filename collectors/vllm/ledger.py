"""Row <-> request bookkeeping of the entropy tap, free of torch and vLLM.

vLLM keeps a *persistent batch*: each running request owns a row of the logits tensor, and
between steps requests are added to rows, removed from rows, moved from one row to another or
swapped. The ledger mirrors that layout so that the entropy computed for row ``i`` at a step is
credited to the request that owned row ``i`` at that step, never to its next occupant.

Entropies are stored by *token position* (how many output tokens the request had when the
logits were computed), not appended blindly: a step whose sample vLLM discards (a partial
chunked-prefill step) is overwritten by the next step at the same position instead of shifting
every later value by one.

A request that leaves the batch is finished from the ledger's point of view and is shipped as a
chunk. vLLM does not tell a logits processor *why* a row was removed (finished or preempted), so
a preempted request that comes back continues with the next ``chunk_index`` from the token where
the previous chunk stopped (``first_token_index``); consumers join chunks by ``request_id``.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

# How many request ids the ledger remembers after shipping, so a preempted request that comes
# back continues its chunk numbering instead of restarting at 0.
RESUMABLE_MEMORY = 4096
# vLLM's _SAMPLING_EPS: a request whose temperature is below it is decoded greedily.
GREEDY_BELOW = 1e-5


def sampling_temperature(temperature: float | None) -> float | None:
    """The temperature a request is sampled at, or None when it is greedy (or not known)."""
    if temperature is None or not math.isfinite(temperature) or temperature < GREEDY_BELOW:
        return None
    return float(temperature)


@dataclass
class RequestTrace:
    """The entropies collected for one request while it sits in the batch."""

    request_id: str
    trace_id: str = ""
    # Reference to vLLM's running list of output token ids (None when the runner gives none):
    # its length at ``apply`` time is the position of the token being sampled.
    output_token_ids: Sequence[int] | None = None
    # Position (output token index) of values[0]; > 0 for a chunk after the first.
    base: int = 0
    chunk_index: int = 0
    values: list[float] = field(default_factory=list)
    non_finite: int = 0  # values that were NaN/Inf (replaced by 0 when shipped) — counted, not hidden
    # The sampled tokens' surprisals by the same positions as ``values`` (credited one step late,
    # once vLLM has sampled the token); NaN where one is missing, which keeps the chunk without them.
    surprisals: list[float] = field(default_factory=list)
    # The request's sampling temperature (None: greedy or unknown, and then no sampling entropies),
    # and the entropies at that temperature by the same positions (NaN where one is missing).
    temperature: float | None = None
    sampling: list[float] = field(default_factory=list)

    def position(self) -> int:
        """Output-token position of the token sampled from this step's logits."""
        if self.output_token_ids is not None:
            return len(self.output_token_ids)
        return self.base + len(self.values)

    def record(self, position: int, value: float) -> None:
        """Store the entropy of the token at ``position`` (overwrites a discarded step's value)."""
        index = position - self.base
        if index < 0:
            return  # a position already shipped in an earlier chunk
        if not math.isfinite(value):
            self.non_finite += 1
            value = 0.0
        # A step never observed leaves no gap: keep the order, do not invent a value.
        _store_at(self.values, index, value, pad=None)

    def record_surprisal(self, position: int, value: float) -> None:
        """Store the surprisal of the token sampled at ``position`` (same positions as ``record``).
        A position never credited is NaN, so the chunk knows it lacks one and ships none."""
        _store_at(self.surprisals, position - self.base, value, pad=math.nan)

    def record_sampling(self, position: int, value: float) -> None:
        """Store the entropy at the sampling temperature of the token at ``position`` (as ``record_surprisal``)."""
        _store_at(self.sampling, position - self.base, value, pad=math.nan)


def _store_at(values: list[float], index: int, value: float, pad: float | None) -> None:
    """Put ``value`` at ``index`` and drop what followed it (the values of a discarded step).
    A negative index was shipped in an earlier chunk: ignored. Past the end: padded with ``pad``
    up to ``index``, or with ``pad=None`` appended right after the last value."""
    if index < 0:
        return
    if pad is not None and index > len(values):
        values.extend([pad] * (index - len(values)))
    if index >= len(values):
        values.append(value)
    else:
        values[index] = value
        del values[index + 1 :]


@dataclass(frozen=True)
class ShippedChunk:
    """One chunk of a request's entropies, ready to become a TokenEntropy record."""

    request_id: str
    trace_id: str
    values: list[float]
    chunk_index: int
    first_token_index: int
    final: bool
    token_ids: list[int] | None = None
    """The sampled token id of each value (same length), or None when the runner gave no id list."""
    surprisals: list[float] | None = None
    """The sampled token's surprisal for each value (same length), or None when any is missing."""
    sampling_entropies: list[float] | None = None
    """The entropy at the request's sampling temperature for each value (same length), or None for a
    greedy request or when any is missing."""


@dataclass(frozen=True)
class AddedRow:
    """A request entering row ``index`` (interface-neutral form of vLLM's AddedRequest)."""

    index: int
    request_id: str
    trace_id: str = ""
    output_token_ids: Sequence[int] | None = None
    temperature: float | None = None
    """SamplingParams.temperature (None when the runner does not say); below ``GREEDY_BELOW``: greedy."""


@dataclass(frozen=True)
class MovedRow:
    """A one-way move ``source -> target`` (``swap=False``) or a swap of two rows."""

    source: int
    target: int
    swap: bool


class RowLedger:
    """Which request owns which logits row, and the entropies collected for each request."""

    def __init__(self, chunk_tokens: int = 4096) -> None:
        if chunk_tokens < 1:
            raise ValueError("chunk_tokens must be >= 1")
        self.chunk_tokens = chunk_tokens
        self.rows: dict[int, RequestTrace] = {}
        # request id -> (next chunk index, next base, trace id) of requests shipped recently
        self._next_chunk: OrderedDict[str, tuple[int, int, str]] = OrderedDict()

    # --- batch layout ------------------------------------------------------------------------
    def apply_update(
        self,
        removed: Iterable[int],
        added: Iterable[AddedRow],
        moved: Iterable[MovedRow],
    ) -> list[ShippedChunk]:
        """Apply one batch update in vLLM's documented order (removed, added, moved).

        Returns the chunks of requests that left the batch. An add or a one-way move onto an
        occupied row evicts the occupant (vLLM: "added or moved requests may replace existing
        requests with the same index"), which ships it too rather than losing it.
        """
        shipped: list[ShippedChunk] = []
        for index in removed:
            trace = self.rows.pop(index, None)
            if trace is not None:
                shipped.append(self._ship(trace, final=True))
        for row in added:
            evicted = self.rows.pop(row.index, None)
            if evicted is not None:
                shipped.append(self._ship(evicted, final=True))
            self.rows[row.index] = self._open(row)
        for move in moved:
            first = self.rows.pop(move.source, None)
            second = self.rows.pop(move.target, None)
            if move.swap:
                if first is not None:
                    self.rows[move.target] = first
                if second is not None:
                    self.rows[move.source] = second
            else:
                if second is not None:
                    shipped.append(self._ship(second, final=True))
                if first is not None:
                    self.rows[move.target] = first
        return shipped

    def snapshot(self, num_rows: int) -> list[tuple[RequestTrace, int] | None]:
        """For each logits row of this step: its request and the position being sampled.

        Taken when the logits are reduced, so values that arrive later are credited to the
        request that owned the row *then*, whatever moves happen in between.
        """
        out: list[tuple[RequestTrace, int] | None] = []
        for index in range(num_rows):
            trace = self.rows.get(index)
            out.append(None if trace is None else (trace, trace.position()))
        return out

    def snapshot_slots(
        self, slots: Sequence[int], positions: Sequence[int]
    ) -> list[tuple[RequestTrace, int] | None]:
        """Like ``snapshot`` when rows are reordered every step (Model Runner V2).

        ``slots[r]`` is the request slot of logits row ``r`` and ``positions[r]`` the output-token
        position being sampled; a negative position is a partial prefill whose sample vLLM
        discards, so it is not credited.
        """
        out: list[tuple[RequestTrace, int] | None] = []
        for slot, position in zip(slots, positions):
            trace = self.rows.get(slot)
            out.append(None if trace is None or position < 0 else (trace, int(position)))
        return out

    def drain_long(self) -> list[ShippedChunk]:
        """Ship full chunks of very long generations (``final=False``) to bound memory."""
        shipped = []
        for trace in self.rows.values():
            while len(trace.values) > self.chunk_tokens:
                # Keep the newest value: it may still be overwritten by a discarded-step rerun.
                head, trace.values = trace.values[: self.chunk_tokens], trace.values[self.chunk_tokens :]
                shipped.append(_chunk(trace, head, final=False))
                trace.surprisals = trace.surprisals[len(head) :]
                trace.sampling = trace.sampling[len(head) :]
                trace.chunk_index += 1
                trace.base += len(head)
        return shipped

    def ship_all(self) -> list[ShippedChunk]:
        """Ship every request still in the batch (shutdown)."""
        shipped = [self._ship(trace, final=True) for trace in self.rows.values()]
        self.rows.clear()
        return shipped

    # --- internals ---------------------------------------------------------------------------
    def _open(self, row: AddedRow) -> RequestTrace:
        chunk_index, base, trace_id = self._next_chunk.pop(row.request_id, (0, 0, ""))
        return RequestTrace(
            request_id=row.request_id,
            trace_id=row.trace_id or trace_id,
            output_token_ids=row.output_token_ids,
            base=base,
            chunk_index=chunk_index,
            temperature=sampling_temperature(row.temperature),
        )

    def _ship(self, trace: RequestTrace, final: bool) -> ShippedChunk:
        values = trace.values
        if trace.output_token_ids is not None:
            # Never ship more values than the request has tokens (a last step whose sample was
            # thrown away, e.g. the request was aborted meanwhile).
            values = values[: max(0, len(trace.output_token_ids) - trace.base)]
        chunk = _chunk(trace, values, final)
        self._next_chunk[trace.request_id] = (trace.chunk_index + 1, trace.base + len(values), trace.trace_id)
        while len(self._next_chunk) > RESUMABLE_MEMORY:
            self._next_chunk.popitem(last=False)
        return chunk


def _chunk(trace: RequestTrace, values: list[float], final: bool) -> ShippedChunk:
    """``values`` (the trace's entropies from ``trace.base`` on) as a chunk, with whatever of the
    per-token extras is complete for them."""
    count = len(values)
    return ShippedChunk(
        trace.request_id, trace.trace_id, values, trace.chunk_index, trace.base, final,
        token_ids=_sampled_ids(trace, count),
        surprisals=_every_one(trace.surprisals, count),
        sampling_entropies=_every_one(trace.sampling, count) if trace.temperature is not None else None,
    )


def _sampled_ids(trace: RequestTrace, count: int) -> list[int] | None:
    """The ids of the ``count`` tokens from ``trace.base`` on, read from vLLM's own output-id list.

    vLLM appends each sampled id to that host-side list itself, so this costs one list slice per
    shipped chunk and never touches the device. A value is only credited once the token at its
    position is being sampled, so every shipped value's token is already in the list; a shorter
    list (or a placeholder id < 0 that an asynchronous scheduler has not filled in yet) means the
    ids cannot be trusted, and the chunk goes without them rather than with wrong ones."""
    if trace.output_token_ids is None or count == 0:
        return None
    ids = list(trace.output_token_ids[trace.base : trace.base + count])
    if len(ids) != count or min(ids) < 0:
        return None
    return ids


def _every_one(credited: list[float], count: int) -> list[float] | None:
    """The first ``count`` values credited one by one (surprisals, sampling entropies), or None unless
    every one of them was credited (finite)."""
    head = credited[:count]
    if count == 0 or len(head) != count or not all(math.isfinite(v) for v in head):
        return None
    return head


def credit(snapshot: Sequence[tuple[RequestTrace, int] | None], values: Sequence[float]) -> None:
    """Credit one step's per-row entropies to the requests captured in ``snapshot``; a request
    sampled at temperature 1 gets them as its sampling entropies too (the same distribution)."""
    for entry, value in zip(snapshot, values):
        if entry is not None:
            trace, position = entry
            trace.record(position, float(value))
            if trace.temperature == 1.0:
                trace.record_sampling(position, float(value))


def credit_sampling(owners: Sequence[tuple[RequestTrace, int]], values: Sequence[float]) -> None:
    """Credit entropies at the sampling temperature to ``(request, position)`` owners (one per value)."""
    for (trace, position), value in zip(owners, values):
        trace.record_sampling(position, float(value))


def needs_sampling_pass(entry: tuple[RequestTrace, int] | None) -> bool:
    """Whether a snapshot row needs its own reduction at its temperature (sampled, and not at T = 1)."""
    return entry is not None and entry[0].temperature is not None and entry[0].temperature != 1.0


def credit_surprisals(owners: Sequence[tuple[RequestTrace, int]], values: Sequence[float]) -> None:
    """Credit surprisals to ``(request, position)`` owners (one per value)."""
    for (trace, position), value in zip(owners, values):
        trace.record_surprisal(position, float(value))


def sampled_token(entry: tuple[RequestTrace, int] | None) -> int | None:
    """The id vLLM sampled for ``entry``'s position, once it is in the request's output list (None
    before that, without a list, or for an asynchronous scheduler's placeholder < 0)."""
    if entry is None:
        return None
    trace, position = entry
    ids = trace.output_token_ids
    if ids is None or len(ids) <= position:
        return None
    token = ids[position]
    return token if token >= 0 else None


ChunkSink = Callable[[ShippedChunk], None]
