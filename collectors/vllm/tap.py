"""The entropy tap: per-step entropy on the device, per-request records on the host.

Interface-neutral: the vLLM adapter (``entroloop.collectors.vllm.vllm_adapter``) translates vLLM's batch
updates into ``AddedRow``/``MovedRow`` and calls ``on_batch_update`` and ``on_logits``. Keeping vLLM
out of this module lets the same tap serve both of vLLM's logits-processor interfaces and keeps it
testable with plain tensors.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence

import torch
from entroloop.collectors.vllm.entropy import HostTransfer
from entroloop.collectors.vllm.fused_entropy import TemperatureEntropy, entropy_function
from entroloop.collectors.vllm.ledger import (
    AddedRow,
    MovedRow,
    RowLedger,
    ShippedChunk,
    credit,
    credit_sampling,
    credit_surprisals,
    needs_sampling_pass,
    sampled_token,
)

log = logging.getLogger(__name__)


class EntropyTap:
    """Computes full-vocabulary entropy per logits row and ships it per request.

    Per step: one reduction over ``[rows, vocab]`` on the logits' device, one ``[rows]`` float32
    copy to the host (asynchronous on CUDA). The logits are never modified.

    Surprisals (``surprisal=True``): the sampled token's ``-log p`` under the same distribution as
    the entropy. vLLM samples *after* the logits processors, so a step's token is known only at the
    next step (or batch update), when it is in the request's output-id list: the reduction keeps
    what it needs until then (``entropy_function(..., keep_for_surprisal=True)``: on a CPU the
    shifted logits it writes anyway, elsewhere a device copy of the logits), and the surprisals of
    the previous step's rows are gathered before this step's logits replace them. They travel to
    the host like the entropies. Without token ids (Model Runner V2) there are none.

    Sampling entropies: each sampled request's entropy at its own temperature (from its
    SamplingParams), which is what says a sampler runs too hot when no token ids travel. At T = 1
    it is the entropy itself (credited on the host, no second pass); rows at any other temperature
    get one more reduction of just those rows (``TemperatureEntropy``). Greedy rows get none.
    """

    def __init__(
        self,
        emit: Callable[[ShippedChunk], None],
        device: torch.device,
        max_rows: int,
        pin_memory: bool = False,
        chunk_tokens: int = 4096,
        surprisal: bool = True,
        compiled: bool = True,
    ) -> None:
        self.emit = emit
        self.device = device
        self.ledger = RowLedger(chunk_tokens=chunk_tokens)
        self.transfer = HostTransfer(device, max_rows=max_rows, pin_memory=pin_memory)
        self.surprisal_transfer = HostTransfer(device, max_rows=max_rows, pin_memory=pin_memory)
        self.sampling_transfer = HostTransfer(device, max_rows=max_rows, pin_memory=pin_memory)
        # fused on CUDA (entroloop.collectors.vllm.fused_entropy); keeps the step's logits for surprisals
        self.entropy = entropy_function(device, keep_for_surprisal=surprisal, compiled=compiled)
        self.ships_surprisals = surprisal
        # the CPU kernel does the sampling pass too, when it is the one measuring (native_entropy)
        self.entropy_at_temperatures = getattr(self.entropy, "at_temperatures", None) or TemperatureEntropy(device)
        self._pending: list | None = None  # last step's snapshot, whose tokens are not sampled yet
        self.steps = 0

    # --- called by the adapter ---------------------------------------------------------------
    def warm_up(self, vocab: int) -> None:
        """Prepare the reduction for ``vocab``-wide logits (compile it, on a CPU) before serving."""
        warm_up = getattr(self.entropy, "warm_up", None)
        if warm_up is not None:
            warm_up(vocab)

    def on_batch_update(
        self, removed: Sequence[int], added: Sequence[AddedRow], moved: Sequence[MovedRow]
    ) -> None:
        """Apply a batch update; requests leaving the batch are shipped."""
        # A leaving request's last values may still be in flight: land them first. This waits
        # only for copies of steps that already finished sampling, so it is (almost) free.
        self._gather_surprisals()
        self._credit_landed(block=bool(removed or added or moved))
        self._emit_all(self.ledger.apply_update(removed, added, moved))

    def on_logits(self, logits: torch.Tensor) -> None:
        """Reduce this step's logits to one entropy per row and start moving it to the host."""
        self._credit_landed(block=False)
        self._reduce(logits, self.ledger.snapshot(logits.shape[0]))

    def on_logits_rows(self, logits: torch.Tensor, slots: Sequence[int], positions: Sequence[int]) -> None:
        """``on_logits`` for runners that reorder rows each step (row ``r`` is request slot ``slots[r]``)."""
        self._credit_landed(block=False)
        self._reduce(logits, self.ledger.snapshot_slots(slots, positions))

    def _reduce(self, logits: torch.Tensor, snapshot: list) -> None:
        self._gather_surprisals()  # before this step's logits replace the last step's
        if not any(entry is not None for entry in snapshot):
            return
        with torch.no_grad():
            values = self.entropy(logits)
        self.transfer.submit(values, snapshot)
        self._reduce_at_temperatures(logits, snapshot)
        self._pending = snapshot if self.ships_surprisals else None
        self.steps += 1

    def _reduce_at_temperatures(self, logits: torch.Tensor, snapshot: list) -> None:
        """The entropy at each sampled row's temperature, for rows not at T = 1 (see the class doc)."""
        rows = [row for row, entry in enumerate(snapshot) if needs_sampling_pass(entry)]
        if not rows:
            return
        owners = [snapshot[row] for row in rows]
        with torch.no_grad():
            values = self.entropy_at_temperatures(logits, rows, [entry[0].temperature for entry in owners])
        self.sampling_transfer.submit(values, owners)

    def _gather_surprisals(self) -> None:
        """The surprisals of the tokens vLLM sampled from the last reduced step's rows."""
        pending, self._pending = self._pending, None
        if not pending:
            return
        rows, tokens, owners = [], [], []
        for row, entry in enumerate(pending):
            token = sampled_token(entry)
            if token is not None:
                rows.append(row)
                tokens.append(token)
                owners.append(entry)
        if not rows:
            return
        with torch.no_grad():
            values = self.entropy.surprisal(rows, tokens)  # type: ignore[attr-defined]
        self.surprisal_transfer.submit(values, owners)

    def flush(self) -> None:
        """Land everything in flight and ship every request still in the batch (shutdown)."""
        self._gather_surprisals()
        self._credit_landed(block=True)
        self._emit_all(self.ledger.ship_all())

    # --- internals ---------------------------------------------------------------------------
    def _credit_landed(self, block: bool) -> None:
        for step in self.transfer.collect(block=block):
            credit(step.owners, step.host.tolist())
        for step in self.surprisal_transfer.collect(block=block):
            credit_surprisals(step.owners, step.host.tolist())
        for step in self.sampling_transfer.collect(block=block):
            credit_sampling(step.owners, step.host.tolist())
        self._emit_all(self.ledger.drain_long())

    def _emit_all(self, chunks: Iterable[ShippedChunk]) -> None:
        for chunk in chunks:
            self.emit(chunk)
