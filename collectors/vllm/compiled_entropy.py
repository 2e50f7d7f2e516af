"""The tap's CPU reduction as one compiled loop nest (``torch.compile``, Inductor's C++ backend).

Used when torch runs several threads (the loops split rows across them) and as the fallback of the
C++ kernel (``native_entropy``), which is faster at one thread: see there.

Same algorithm and base-2 numerics as ``entropy_per_row_shifted`` (``fused_entropy``), but where the
torch-op form writes two float32 ``[rows, vocab]`` buffers (the shifted logits ``z`` and ``2^z``)
and reads them back, the compiled loops keep ``2^z`` in registers and write only ``z``, in float16,
for the surprisals. Why it matters inside an engine: between two steps the forward pass streams the
model's weights through every cache, so each line the tap writes is a DRAM read (to allocate it) and
later a write-back, paid partly during the next forward pass. Measured inside vLLM's CPU engine
(Qwen2.5-0.5B's shape, 8 rows of 151,936, one thread as vLLM runs here; two A/B rounds each): the
tap's own time per step 1.51-1.53 ms with the torch-op form, 1.28-1.33 ms with this one
(`entroloop bench collector` times both alone too).

Why float16 for ``z`` is no loss: a surprisal is ``ln 2 · (log2(s) - z[token])`` with ``z <= 0`` and
``log2(s) >= 0``, so z's relative rounding (2^-11) is at most that of the surprisal itself, and the
wire format (``pack_entropies``) stores surprisals as float16 anyway. The entropy is computed from
the float32 values, never from the rounded ``z``.

Compiling needs a C++ compiler, as vLLM's CPU build does for its own ``torch.compile``; where it
fails, the tap logs why once and runs the torch-op form (``BufferedShiftedEntropy``) instead.

The compiled kernels are shared libraries that Inductor caches on disk and loads into the engine:
whoever can write to that folder can run code in the engine. Torch does not check who owns it, so
the tap does (``unsafe_cache_reason``) and runs the torch-op form, saying why, when the folder is
someone else's or writable by others (a ``/tmp/torchinductor_<user>`` made first by another user).
"""

from __future__ import annotations

import functools
import logging
import os
import stat
from collections.abc import Callable, Sequence

import torch
from entroloop.collectors.vllm.fused_entropy import (
    LN_2,
    LOG2_E,
    MASK_FLOOR,
    BufferedShiftedEntropy,
    surprisals_from_shifts,
)

log = logging.getLogger(__name__)

_Z_DTYPE = torch.float16


def _entropy_and_log2_sum(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(entropy in nats, log2(sum 2^z), z) per row; traced by ``torch.compile`` (see the module doc).
    Masked tokens (-inf) and the long tail are floored as in ``entropy_per_row_shifted``; the max's z
    is exactly 0 here (the shift is subtracted before scaling)."""
    x = logits.float()
    z = ((x - x.amax(dim=-1, keepdim=True)) * LOG2_E).clamp(min=MASK_FLOOR * LOG2_E)
    e = torch.exp2(z)
    s = e.sum(dim=-1)
    t = (e * z).sum(dim=-1)
    return (torch.log(s) - t * (LN_2 / s)).clamp(min=0.0), torch.log2(s), z


def _into_kept(logits: torch.Tensor, z_kept: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    entropy, log2_sum, z = _entropy_and_log2_sum(logits)
    z_kept.copy_(z)  # fused into the loop nest: z is stored once, in float16, never as float32
    return entropy, log2_sum


def _entropy_only(logits: torch.Tensor) -> torch.Tensor:
    return _entropy_and_log2_sum(logits)[0]


@functools.cache
def _kernel(keep_for_surprisal: bool) -> Callable:
    """One compiled function per form for the whole process: every ``torch.compile`` wrapper would
    compile the same code again, and after a few dozen such recompiles torch runs it uncompiled.
    Dynamic shapes: one kernel for every batch size (and one for a single row, which torch
    specialises); several seconds the first time, then from Inductor's on-disk cache."""
    return torch.compile(_into_kept if keep_for_surprisal else _entropy_only, dynamic=True)


def unsafe_cache_reason(folder: str) -> str | None:
    """Why Inductor's cache ``folder`` may hold code this process must not load, or None when only
    this user can write to it."""
    info = os.stat(folder)
    if info.st_uid != os.getuid():
        return f"{folder} belongs to uid {info.st_uid}, not to this process's user ({os.getuid()})"
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{folder} is writable by other users (mode {stat.filemode(info.st_mode)})"
    return None


def _inductor_cache_dir() -> str:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return cache_dir()  # TORCHINDUCTOR_CACHE_DIR, else <tmp>/torchinductor_<user>; made if missing


class CompiledShiftedEntropy:
    """The tap's entropy reduction on a CPU: compiled on first use (or ``warm_up``), with the
    float16 shifted logits of the last call kept for ``surprisal`` when ``keep_for_surprisal``.

    Same interface as ``BufferedShiftedEntropy``, to which it falls back for good (logged once) if
    compiling or a compiled call fails."""

    def __init__(self, keep_for_surprisal: bool = False) -> None:
        self.keep_for_surprisal = keep_for_surprisal
        self._kernel = _kernel(keep_for_surprisal)
        self.fallback: BufferedShiftedEntropy | None = None
        unsafe = unsafe_cache_reason(_inductor_cache_dir())
        if unsafe:
            log.error("entroloop entropy tap: not loading compiled kernels: %s. Set TORCHINDUCTOR_CACHE_DIR to a "
                      "folder only this user can write (or ENTROLOOP_ENTROPY_TAP_COMPILED=false); using the "
                      "torch-op form", unsafe)
            self.fallback = BufferedShiftedEntropy(keep_for_surprisal=keep_for_surprisal)
        self._z: torch.Tensor | None = None
        self._z_host = None  # numpy view of _z: a handful of reads per step without torch dispatch
        self._log2_sum: list[float] = []

    def warm_up(self, vocab: int) -> None:
        """Compile now (for one row and for several) rather than in the first serving step; vLLM runs
        the logits processors under inference mode, which the compiled code is specialised for."""
        with torch.inference_mode():
            for rows in (1, 2):
                self(torch.zeros(rows, vocab))

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        if logits.dim() != 2:
            raise ValueError(f"logits must be [rows, vocab], got shape {tuple(logits.shape)}")
        if self.fallback is None:
            try:
                return self._compiled(logits)
            except Exception:  # no C++ compiler, an Inductor bug: never the engine's failure
                log.exception("entroloop entropy tap: the compiled CPU reduction failed; using the torch-op form "
                              "from now on")
                self.fallback = BufferedShiftedEntropy(keep_for_surprisal=self.keep_for_surprisal)
        return self.fallback(logits)

    def _compiled(self, logits: torch.Tensor) -> torch.Tensor:
        rows, vocab = logits.shape
        if rows == 0:
            return torch.empty(0, dtype=torch.float32, device=logits.device)
        if not self.keep_for_surprisal:
            return self._kernel(logits)
        if self._z is None or self._z.shape[1] != vocab or self._z.shape[0] < rows:
            self._z = torch.empty(max(rows, 8), vocab, dtype=_Z_DTYPE)  # grown to the largest batch seen
            self._z_host = self._z.numpy()
        entropy, log2_sum = self._kernel(logits, self._z[:rows])
        self._log2_sum = log2_sum.tolist()
        return entropy

    def surprisal(self, rows: Sequence[int], tokens: Sequence[int]) -> torch.Tensor:
        """``-log p(tokens[i])`` in nats under row ``rows[i]``'s softmax at the last call (float32);
        only with ``keep_for_surprisal``. Tokens floored at ``MASK_FLOOR`` read as at most ~87 nats."""
        if self.fallback is not None:
            return self.fallback.surprisal(rows, tokens)
        if not self.keep_for_surprisal or self._z_host is None:
            raise RuntimeError("surprisal needs keep_for_surprisal=True and a call before it")
        return surprisals_from_shifts(rows, tokens, self._z_host.shape[1], self._z_host.item, self._log2_sum)
