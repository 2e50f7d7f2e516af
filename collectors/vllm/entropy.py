"""On-device entropy reduction and the asynchronous device -> host hand-off of its result.

Only one float32 per logits row ever leaves the device. On CUDA the copy goes into a pinned host
buffer with ``non_blocking=True`` and an event marks when it has landed, so the serving step never
waits for it; the values are read a step later (or when a request leaves the batch). On CPU the
"device" is the host, so the result is simply kept.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch


def entropy_per_row(logits: torch.Tensor) -> torch.Tensor:
    """Shannon entropy in nats of softmax(logits) for each row, float32, on the logits' device.

    ``H = sum(entr(softmax(x)))`` with ``entr(p) = -p log p`` (and ``entr(0) = 0``, so tokens masked
    to -inf contribute nothing). The softmax is the max-shifted (logsumexp) one, in float32 whatever
    the logits' dtype; ``entr`` runs in place on the probabilities, so a step allocates one
    ``[rows, vocab]`` float32 buffer and returns ``[rows]``.

    Why not ``logsumexp(x) - sum(softmax(x) * x)``: for confident rows (large logits, entropy near
    0) the two terms are large and nearly equal and float32 cancels them catastrophically — measured
    ~1e-3 nats of error at logit scale 30, against <= 1e-5 for this form at every scale tried.
    """
    p = torch.softmax(logits, dim=-1, dtype=torch.float32)
    return torch.special.entr(p, out=p).sum(dim=-1)


@dataclass
class InFlightStep:
    """One step's entropies on their way to the host, with the rows they belong to."""

    host: torch.Tensor  # [rows] float32 (a slice of a pinned buffer on CUDA)
    event: Any  # torch.cuda.Event or None (CPU: already on the host)
    owners: Sequence[Any]  # opaque per-row owners (the ledger snapshot)
    buffer_slot: int = -1

    def ready(self) -> bool:
        return self.event is None or bool(self.event.query())

    def wait(self) -> None:
        if self.event is not None:
            self.event.synchronize()


class HostTransfer:
    """Moves a [rows] float32 device tensor to the host without blocking the step.

    A small ring of pinned buffers sized for the largest batch is reused; a buffer is reused only
    after its event completed (waiting on it is the back-pressure, and only happens when the host
    falls ``ring`` steps behind).
    """

    def __init__(self, device: torch.device, max_rows: int, pin_memory: bool, ring: int = 4) -> None:
        self.device = device
        self.on_accelerator = device.type == "cuda"
        self.max_rows = max_rows
        self._buffers: list[torch.Tensor] = []
        self._busy: list[InFlightStep | None] = []
        self._next = 0
        if self.on_accelerator:
            self._buffers = [
                torch.empty(max_rows, dtype=torch.float32, pin_memory=pin_memory) for _ in range(ring)
            ]
            self._busy = [None] * ring
        self.pending: deque[InFlightStep] = deque()

    def submit(self, values: torch.Tensor, owners: Sequence[Any]) -> None:
        """Start moving ``values`` ([rows] float32 on the device) to the host."""
        rows = values.shape[0]
        if not self.on_accelerator or rows > self.max_rows:
            # CPU (or an unexpectedly large batch): the values are host-side already / copied once.
            host = values if values.device.type == "cpu" else values.to("cpu")
            self.pending.append(InFlightStep(host, None, owners))
            return
        slot = self._next
        self._next = (self._next + 1) % len(self._buffers)
        previous = self._busy[slot]
        if previous is not None:
            previous.wait()  # the host fell a full ring behind: wait rather than overwrite
        host = self._buffers[slot][:rows]
        host.copy_(values, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        step = InFlightStep(host, event, owners, slot)
        self._busy[slot] = step
        self.pending.append(step)

    def collect(self, block: bool) -> list[InFlightStep]:
        """Steps whose values are on the host, oldest first; ``block`` waits for all of them."""
        done: list[InFlightStep] = []
        while self.pending:
            step = self.pending[0]
            if not step.ready():
                if not block:
                    break
                step.wait()
            self.pending.popleft()
            if step.buffer_slot >= 0 and self._busy[step.buffer_slot] is step:
                self._busy[step.buffer_slot] = None
            done.append(step)
        return done
