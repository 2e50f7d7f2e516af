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
from entroloop.collectors.vllm.fused_entropy import entropy_function
from entroloop.collectors.vllm.ledger import (
    AddedRow,
    MovedRow,
    RowLedger,
    ShippedChunk,
    credit,
)

log = logging.getLogger(__name__)


class EntropyTap:
    """Computes full-vocabulary entropy per logits row and ships it per request.

    Per step: one reduction over ``[rows, vocab]`` on the logits' device, one ``[rows]`` float32
    copy to the host (asynchronous on CUDA). The logits are never modified or copied in full.
    """

    def __init__(
        self,
        emit: Callable[[ShippedChunk], None],
        device: torch.device,
        max_rows: int,
        pin_memory: bool = False,
        chunk_tokens: int = 4096,
    ) -> None:
        self.emit = emit
        self.ledger = RowLedger(chunk_tokens=chunk_tokens)
        self.transfer = HostTransfer(device, max_rows=max_rows, pin_memory=pin_memory)
        self.entropy = entropy_function(device)  # fused on CUDA (entroloop.collectors.vllm.fused_entropy)
        self.steps = 0

    # --- called by the adapter ---------------------------------------------------------------
    def on_batch_update(
        self, removed: Sequence[int], added: Sequence[AddedRow], moved: Sequence[MovedRow]
    ) -> None:
        """Apply a batch update; requests leaving the batch are shipped."""
        # A leaving request's last values may still be in flight: land them first. This waits
        # only for copies of steps that already finished sampling, so it is (almost) free.
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
        if not any(entry is not None for entry in snapshot):
            return
        with torch.no_grad():
            values = self.entropy(logits)
        self.transfer.submit(values, snapshot)
        self.steps += 1

    def flush(self) -> None:
        """Land everything in flight and ship every request still in the batch (shutdown)."""
        self._credit_landed(block=True)
        self._emit_all(self.ledger.ship_all())

    # --- internals ---------------------------------------------------------------------------
    def _credit_landed(self, block: bool) -> None:
        for step in self.transfer.collect(block=block):
            credit(step.owners, step.host.tolist())
        self._emit_all(self.ledger.drain_long())

    def _emit_all(self, chunks: Iterable[ShippedChunk]) -> None:
        for chunk in chunks:
            self.emit(chunk)
