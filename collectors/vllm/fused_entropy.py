"""Single-pass entropy per logits row: online max / sum-exp / sum p·x, for the GPU.

The reference (``entroloop.collectors.vllm.entropy.entropy_per_row``) runs softmax, then ``entr``, then a
sum: three passes over ``[rows, vocab]`` and a float32 buffer of that size per step. Here every
logit is read once and nothing of the vocabulary's size is written. For a run of logits ``x`` with
running maximum ``m`` the state is

    s = sum(exp(x - m)),   t = sum(exp(x - m) * (x - m)),   H = log(s) - t / s

and two states merge by rescaling to the larger maximum ``M``: ``s = Σ w·s_i``,
``t = Σ w·(t_i + (m_i - M)·s_i)`` with ``w = exp(m_i - M)``. The terms are taken relative to the
maximum, so confident rows (large logits, entropy near 0) do not cancel catastrophically the way
``logsumexp(x) - sum(softmax(x)·x)`` does in float32. Tokens masked to ``-inf`` contribute nothing; a
row with every token masked gives NaN, as the reference does.

Two implementations of the same algorithm:

* ``entropy_per_row_triton``: a Triton kernel (one program per row and vocabulary split, so a
  small decode batch still fills the GPU) writes per-split states, a second tiny kernel merges them;
* ``entropy_per_row_chunked``: pure torch, over vocabulary chunks (any device; the fallback, and
  what the CPU tests check the algorithm with).

``entropy_per_row_shifted`` is the algorithm as a single chunk in torch: on a CPU it beats both the
reference (no per-element log) and the chunked loop (no per-chunk merges); ``BufferedShiftedEntropy``
is the same with its temporaries kept between steps. ``entropy_function(device)`` picks what the tap uses (`entroloop bench collector` times every form side by side).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence

import torch
from entroloop.collectors.vllm.entropy import entropy_per_row

log = logging.getLogger(__name__)

EntropyFn = Callable[[torch.Tensor], torch.Tensor]

CHUNK = 16384  # columns per step of the torch fallback: [rows, CHUNK] float32 stays in cache
BLOCK = 1024  # columns per inner step of the Triton kernel (a power of two)
LOG2_E = 1.0 / math.log(2.0)  # exp(y) = 2 ** (y * LOG2_E)
LN_2 = math.log(2.0)
MASK_FLOOR = -87.0  # exp(-87) ~ 1.6e-38: still a normal float32 (no denormal slow path); see entropy_per_row_shifted
TARGET_PROGRAMS = 512  # enough programs for every SM of a large GPU several times over


# --- the merge, in torch (the fallback's and the tests' definition of the algorithm) ------------
def _merge(m1, s1, t1, m2, s2, t2, scale=None):
    """Merge two (max, sum-exp, sum-exp·shifted) states; empty states (s == 0) contribute nothing.

    With ``scale`` (per row, the inverse temperature) the maxima stay in the logits' own units and
    the sums are of the scaled shifts: ``m_i - M`` is then exact for float32 logits (Sterbenz), and
    only the product with ``scale`` rounds, as it does inside a chunk."""
    m = torch.maximum(m1, m2)
    m_safe = torch.where(torch.isfinite(m), m, torch.zeros_like(m))
    live1, live2 = s1 > 0, s2 > 0
    d1, d2 = m1 - m_safe, m2 - m_safe
    if scale is not None:
        d1, d2 = d1 * scale, d2 * scale
    w1 = torch.where(live1, torch.exp(d1), torch.zeros_like(s1))
    w2 = torch.where(live2, torch.exp(d2), torch.zeros_like(s2))
    shift1 = torch.where(live1, d1 * s1, torch.zeros_like(s1))
    shift2 = torch.where(live2, d2 * s2, torch.zeros_like(s2))
    return m, w1 * s1 + w2 * s2, w1 * (t1 + shift1) + w2 * (t2 + shift2)


def _finish(s: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    return torch.log(s) - t / s


def entropy_per_row_chunked(logits: torch.Tensor, chunk: int = CHUNK, rows: torch.Tensor | None = None,
                            inverse_temperature: torch.Tensor | None = None) -> torch.Tensor:
    """Entropy in nats per row, float32, one pass over the logits in ``chunk``-column pieces.

    ``rows`` (long, optional): only those rows, in that order (a ``[rows, chunk]`` copy at a time,
    never one of the vocabulary's size). ``inverse_temperature`` (``[rows]``, > 0, optional): the
    entropy of ``softmax(logits * inverse_temperature)``, i.e. at each row's sampling temperature;
    scaling after the max shift keeps the algorithm's numerics (the max of ``x / T`` is ``max / T``)."""
    if logits.dim() != 2:
        raise ValueError(f"logits must be [rows, vocab], got shape {tuple(logits.shape)}")
    vocab = logits.shape[1]
    rows_n = logits.shape[0] if rows is None else rows.shape[0]
    scale = None if inverse_temperature is None else inverse_temperature.to(torch.float32)
    if scale is not None and scale.shape != (rows_n,):
        raise ValueError(f"inverse_temperature must have one value per row ({rows_n}), got {tuple(scale.shape)}")
    f32 = {"dtype": torch.float32, "device": logits.device}
    m = torch.full((rows_n,), -math.inf, **f32)
    s = torch.zeros(rows_n, **f32)
    t = torch.zeros(rows_n, **f32)
    buf = torch.empty(rows_n, min(chunk, vocab), **f32)
    for start in range(0, vocab, chunk):
        x = logits[:, start : start + chunk] if rows is None else logits[rows, start : start + chunk]
        y = buf[:, : x.shape[1]]
        cm = x.amax(dim=-1).float()
        cm_safe = torch.where(torch.isfinite(cm), cm, torch.zeros_like(cm))
        torch.sub(x, cm_safe[:, None], out=y)  # x - max <= 0 (float32 whatever x's dtype)
        if scale is not None:
            y.mul_(scale[:, None])  # (x - max) / T: the shifted logits of x / T
        y.exp_()  # e; exp(-inf) = 0 for masked tokens
        cs = y.sum(dim=-1)
        # e·(x - max) = e·log(e) = -entr(e), which is 0 for masked tokens (no -inf·0)
        ct = -torch.special.entr(y, out=y).sum(dim=-1)
        m, s, t = _merge(m, s, t, cm, cs, ct, scale)
    return _finish(s, t)


def entropy_per_row_shifted(logits: torch.Tensor, z: torch.Tensor | None = None,
                            e: torch.Tensor | None = None, log2_sum: torch.Tensor | None = None,
                            inverse_temperature: torch.Tensor | None = None) -> torch.Tensor:
    """The same algorithm as one chunk, vectorised by torch, in base 2: the max, then
    ``z = (x - max)·log2(e)`` in one pass, its ``exp2``, and two row reductions (sum, dot) — no
    per-element log, unlike the reference's ``entr``, and one ``[rows, vocab]`` float32 temporary
    fewer. The tap runs it with kept buffers on a CPU (``BufferedShiftedEntropy``, see
    ``entropy_function``).

    Why base 2: torch's CPU ``exp`` kernel is ~3x slower than its ``exp2`` (measured for
    [8, 151,936] float32 on one thread: 743 us, against 257 for a multiply and ``exp2`` together),
    and folding the ``log2(e)`` factor into the shift (``add`` with a scalar ``alpha``) costs no
    pass of its own. With ``s = sum(2^z)`` and ``t = sum(2^z·z)``, ``H = ln(s) - ln(2)·t/s`` nats.

    Given ``log2_sum`` (``[rows]`` float32), it also receives ``log2(s)``: with ``z`` that is each
    token's surprisal, ``ln(2)·(log2_sum - z[token])`` nats, for free.

    ``inverse_temperature`` (``[rows]``, > 0): the entropy of ``softmax(x / T)`` instead, by scaling
    ``x - max`` (the max of ``x / T`` is ``max / T``)."""
    if logits.dim() != 2:
        raise ValueError(f"logits must be [rows, vocab], got shape {tuple(logits.shape)}")
    f32 = {"dtype": torch.float32, "device": logits.device}
    m = logits.amax(dim=-1, keepdim=True).float()
    # z, e: float32 temporaries of the logits' shape, made here unless given (BufferedShiftedEntropy)
    z = torch.empty(logits.shape, **f32) if z is None else z
    if inverse_temperature is None:
        torch.add(m * -LOG2_E, logits, alpha=LOG2_E, out=z)  # x·log2(e) - max·log2(e)
    else:  # a per-row factor: addcmul (2x the cost of add, but only the tap's sampling pass needs it)
        scale = inverse_temperature.to(torch.float32)[:, None] * LOG2_E
        torch.addcmul(-m * scale, logits, scale, out=z)
    # A floor: masked tokens (-inf) give a finite e·z instead of -inf·0 = NaN, and no exp2() lands
    # in float32's subnormal range (below 2^-126), where the CPU takes a slow path — measured 10x
    # slower on a confident model's logits, whose long tail sits exactly there. A floored token adds
    # at most e^-87·87 ~ 1e-36 nats: < 2e-31 over 151,936 tokens, far below float16's resolution.
    z.clamp_(min=MASK_FLOOR * LOG2_E)
    e = torch.exp2(z, out=torch.empty(logits.shape, **f32) if e is None else e)
    s = e.sum(dim=-1)
    if log2_sum is not None:
        torch.log2(s, out=log2_sum)
    # The add rounds x·log2(e) and max·log2(e) apart (one fused multiply-add), so the max's z is
    # within an ulp of 0, not exactly 0: a confident row's entropy can come out ~1e-8 below 0.
    return (torch.log(s) - _row_dots(e, z) * (LN_2 / s)).clamp_(min=0.0)


def _row_dots(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``sum(a·b)`` per row, one BLAS dot each: ``linalg.vecdot`` multiplies into a fresh
    ``[rows, vocab]`` temporary and sums it (one write and one read more of the vocabulary's size)."""
    out = torch.empty(a.shape[0], dtype=a.dtype, device=a.device)
    for row in range(a.shape[0]):
        torch.dot(a[row], b[row], out=out[row])
    return out


class BufferedShiftedEntropy:
    """``entropy_per_row_shifted`` with its two float32 temporaries kept between calls, a block of
    ``block_rows`` rows at a time: what the tap runs on a CPU.

    Why: each step's fresh ``[rows, vocab]`` temporaries (9.7 MB for 8 rows of 151,936) are large
    enough that the allocator maps new pages, which the kernel then faults in and zeroes. Measured
    on this 2-core machine for [8, 151,936]: 4.9 ms per call with fresh temporaries, 1.3 ms with
    these (3.3 ms after 300 MB of other memory traffic, as an engine step makes) - the bulk of the tap's
    cost per engine step on Qwen2.5-0.5B's shape. The blocks bound the memory kept (two
    ``[block_rows, vocab]`` float32 buffers) whatever the batch.

    With ``keep_for_surprisal`` the shifted logits ``z`` of *every* row are kept until the next
    call (one ``[rows, vocab]`` float32 buffer, grown to the largest batch seen, instead of a block),
    with each row's ``log2(sum(2^z))``: ``surprisal(rows, tokens)`` then reads the sampled
    tokens' surprisals one step late, when vLLM has sampled them, without a copy of the logits."""

    def __init__(self, block_rows: int = 8, keep_for_surprisal: bool = False) -> None:
        self.block_rows = block_rows
        self.keep_for_surprisal = keep_for_surprisal
        self._z: torch.Tensor | None = None
        self._e: torch.Tensor | None = None
        self._log2_sum: torch.Tensor | None = None
        self._z_flat: memoryview | None = None
        self._log2_sum_flat: memoryview | None = None

    def _buffers(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows, vocab = logits.shape
        z_rows = max(rows, self.block_rows) if self.keep_for_surprisal else self.block_rows
        f32 = {"dtype": torch.float32, "device": logits.device}
        if self._e is None or self._e.shape[1] != vocab or self._e.device != logits.device:
            self._e, self._z = torch.empty(self.block_rows, vocab, **f32), None
        if self._z is None or self._z.shape[0] < z_rows:
            self._z = torch.empty(z_rows, vocab, **f32)
            self._log2_sum = torch.empty(z_rows, **f32)
            # host views for surprisal(): the buffers are on the CPU (this class is the CPU form)
            self._z_flat = memoryview(self._z.numpy().reshape(-1))
            self._log2_sum_flat = memoryview(self._log2_sum.numpy())
        return self._z, self._e

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        if logits.dim() != 2:
            raise ValueError(f"logits must be [rows, vocab], got shape {tuple(logits.shape)}")
        rows = logits.shape[0]
        if rows == 0:
            return torch.empty(0, dtype=torch.float32, device=logits.device)
        z_buf, e_buf = self._buffers(logits)
        if rows <= self.block_rows:  # one block (a decode batch within max_num_seqs): no gathering copy
            log2_sum = self._log2_sum[:rows] if self.keep_for_surprisal else None
            return entropy_per_row_shifted(logits, z_buf[:rows], e_buf[:rows], log2_sum)
        out = torch.empty(rows, dtype=torch.float32, device=logits.device)
        for start in range(0, rows, self.block_rows):
            x = logits[start : start + self.block_rows]
            n = x.shape[0]
            kept = start if self.keep_for_surprisal else 0
            log2_sum = self._log2_sum[kept : kept + n] if self.keep_for_surprisal else None
            out[start : start + n] = entropy_per_row_shifted(x, z_buf[kept : kept + n], e_buf[:n], log2_sum)
        return out

    def surprisal(self, rows: Sequence[int], tokens: Sequence[int]) -> torch.Tensor:
        """``-log p(tokens[i])`` in nats under row ``rows[i]``'s softmax at the last call (float32); only
        with ``keep_for_surprisal``. Tokens floored at ``MASK_FLOOR`` read as at most ~87 nats.

        Read through flat memoryviews of the kept buffers (they are on the host): a handful of values,
        where index tensors and advanced indexing cost ~90 us per step inside the engine (its caches
        are cold after the forward pass, and each torch or numpy op dispatched pays for that)."""
        if not self.keep_for_surprisal or self._z is None or self._log2_sum is None:
            raise RuntimeError("surprisal needs keep_for_surprisal=True and a call before it")
        z, vocab = self._z_flat, self._z.shape[1]
        return surprisals_from_shifts(rows, tokens, vocab, lambda row, token: z[row * vocab + token],
                                      self._log2_sum_flat)


def surprisals_from_shifts(rows: Sequence[int], tokens: Sequence[int], vocab: int,
                           z_at: Callable[[int, int], float], log2_sum: Sequence[float]) -> torch.Tensor:
    """``ln(2)·(log2_sum[row] - z[row, token])`` nats for each (row, token), as float32: the surprisals
    from a CPU form's kept base-2 shifts, read one value at a time (``z_at``) on the host."""
    values = []
    for row, token in zip(rows, tokens):
        if not 0 <= token < vocab:  # a flat index would read another row's value
            raise IndexError(f"token {token} is outside the vocabulary (0..{vocab - 1})")
        # >= 0: the max's z may sit within an ulp of 0, not at 0 (see entropy_per_row_shifted), so a
        # token with p ~ 1 (a forced or very confident one) would otherwise read a hair below 0 nats
        values.append(max(0.0, (log2_sum[row] - z_at(row, token)) * LN_2))
    return torch.tensor(values, dtype=torch.float32)


class TemperatureEntropy:
    """The entropy of chosen rows at their own sampling temperatures: the tap's sampling pass.

    On a CPU the one-chunk form, row by row into two kept ``[1, vocab]`` buffers (views of the
    logits, no copy): the chunked form's per-element log and subnormal exps cost ~13x there (`entroloop
    bench collector`: 19.8 ms against 1.4 ms for [8, 151,936]). Elsewhere the chunked torch form over
    just those rows (``[rows, chunk]`` pieces; a GPU does not slow down on subnormals). Where the
    tap measures with the C++ kernel, that kernel does this pass too (``NativeShiftedEntropy.at_temperatures``:
    150 µs against this form's 677 µs for 4 rows of 151,936 on one thread)."""

    def __init__(self, device: torch.device) -> None:
        self.on_cpu = torch.device(device).type == "cpu"
        self._z: torch.Tensor | None = None
        self._e: torch.Tensor | None = None

    def __call__(self, logits: torch.Tensor, rows: list[int], temperatures: list[float]) -> torch.Tensor:
        inverse = torch.tensor([1.0 / t for t in temperatures], dtype=torch.float32)
        if not self.on_cpu:
            index = torch.tensor(rows, dtype=torch.long).to(logits.device, non_blocking=True)
            return entropy_per_row_chunked(logits, rows=index, inverse_temperature=inverse.to(logits.device))
        vocab = logits.shape[1]
        if self._z is None or self._z.shape[1] != vocab:
            self._z = torch.empty(1, vocab, dtype=torch.float32)
            self._e = torch.empty(1, vocab, dtype=torch.float32)
        out = torch.empty(len(rows), dtype=torch.float32)
        for i, row in enumerate(rows):
            out[i : i + 1] = entropy_per_row_shifted(logits[row : row + 1], self._z, self._e,
                                                     inverse_temperature=inverse[i : i + 1])
        return out


class KeptLogits:
    """Any entropy function plus a copy of the step's logits, for one-step-late surprisals on a
    device where the reduction keeps nothing (the fused kernel writes nothing of the vocabulary's
    size). The copy is one device-to-device ``[rows, vocab]`` memcpy into a kept buffer; the
    log-sum-exp is computed later, only for the rows asked about."""

    def __init__(self, entropy: EntropyFn) -> None:
        self.entropy = entropy
        self._kept: torch.Tensor | None = None

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        values = self.entropy(logits)
        kept = self._kept
        if kept is None or kept.shape[0] < logits.shape[0] or kept.shape[1:] != logits.shape[1:] \
                or kept.dtype != logits.dtype or kept.device != logits.device:
            kept = self._kept = torch.empty_like(logits)
        kept[: logits.shape[0]].copy_(logits)
        return values

    def surprisal(self, rows: Sequence[int], tokens: Sequence[int]) -> torch.Tensor:
        if self._kept is None:
            raise RuntimeError("surprisal needs a call before it")
        index = torch.tensor([list(rows), list(tokens)], dtype=torch.long).to(self._kept.device, non_blocking=True)
        picked = self._kept[index[0]].float()
        return (torch.logsumexp(picked, dim=-1) - picked.gather(1, index[1][:, None]).squeeze(1)).clamp_(min=0.0)


# --- Triton ------------------------------------------------------------------------------------
def triton_available() -> bool:
    try:
        import triton
        import triton.language  # noqa: F401
    except Exception:  # noqa: BLE001 - any import failure means "not here"
        return False
    return True


_KERNELS: tuple | None = None


def _kernels():
    """Define the kernels on first use (Triton reads TRITON_INTERPRET when a kernel is defined)."""
    global _KERNELS
    if _KERNELS is not None:
        return _KERNELS
    import triton
    import triton.language as tl

    @triton.jit
    def partials_kernel(logits_ptr, row_stride, vocab, split_size, m_ptr, s_ptr, t_ptr, n_splits,
                        BLOCK: tl.constexpr):
        row = tl.program_id(0)
        split = tl.program_id(1)
        start = split * split_size
        end = tl.minimum(start + split_size, vocab)
        lanes = tl.arange(0, BLOCK)
        neg_inf = float("-inf")
        m = tl.full([BLOCK], neg_inf, tl.float32)
        s = tl.zeros([BLOCK], tl.float32)
        t = tl.zeros([BLOCK], tl.float32)
        base = logits_ptr + row.to(tl.int64) * row_stride
        for off in range(start, end, BLOCK):
            cols = off + lanes
            x = tl.load(base + cols, mask=cols < end, other=neg_inf).to(tl.float32)
            m_new = tl.maximum(m, x)
            live = m_new > neg_inf
            m_safe = tl.where(live, m_new, 0.0)
            alpha = tl.where(s > 0, tl.exp(m - m_safe), 0.0)
            shift = tl.where(s > 0, (m - m_safe) * s, 0.0)
            y = x - m_safe
            e = tl.where(x > neg_inf, tl.exp(y), 0.0)
            s_new = alpha * s + e
            t = alpha * (t + shift) + tl.where(x > neg_inf, e * y, 0.0)
            s = s_new
            m = m_new
        # merge the lanes
        big = tl.max(m, axis=0)
        big_safe = tl.where(big > neg_inf, big, 0.0)
        w = tl.where(s > 0, tl.exp(m - big_safe), 0.0)
        shift = tl.where(s > 0, (m - big_safe) * s, 0.0)
        out = row * n_splits + split
        tl.store(m_ptr + out, big)
        tl.store(s_ptr + out, tl.sum(w * s, axis=0))
        tl.store(t_ptr + out, tl.sum(w * (t + shift), axis=0))

    @triton.jit
    def merge_kernel(m_ptr, s_ptr, t_ptr, out_ptr, n_splits, SPLITS: tl.constexpr):
        row = tl.program_id(0)
        idx = tl.arange(0, SPLITS)
        ok = idx < n_splits
        neg_inf = float("-inf")
        m = tl.load(m_ptr + row * n_splits + idx, mask=ok, other=neg_inf)
        s = tl.load(s_ptr + row * n_splits + idx, mask=ok, other=0.0)
        t = tl.load(t_ptr + row * n_splits + idx, mask=ok, other=0.0)
        big = tl.max(m, axis=0)
        big_safe = tl.where(big > neg_inf, big, 0.0)
        w = tl.where(s > 0, tl.exp(m - big_safe), 0.0)
        shift = tl.where(s > 0, (m - big_safe) * s, 0.0)
        total_s = tl.sum(w * s, axis=0)
        total_t = tl.sum(w * (t + shift), axis=0)
        tl.store(out_ptr + row, tl.log(total_s) - total_t / total_s)

    _KERNELS = (partials_kernel, merge_kernel, triton.next_power_of_2)
    return _KERNELS


def split_plan(rows: int, vocab: int, block: int = BLOCK, target_programs: int = TARGET_PROGRAMS) -> tuple[int, int]:
    """(splits per row, columns per split): enough programs to fill the device, whole blocks each."""
    blocks = max(1, math.ceil(vocab / block))
    splits = min(blocks, max(1, math.ceil(target_programs / max(1, rows))))
    split_size = math.ceil(blocks / splits) * block
    return math.ceil(vocab / split_size), split_size


def entropy_per_row_triton(logits: torch.Tensor, block: int = BLOCK) -> torch.Tensor:
    """Entropy in nats per row, float32: the Triton kernels (CUDA, or CPU tensors under TRITON_INTERPRET=1)."""
    if logits.dim() != 2:
        raise ValueError(f"logits must be [rows, vocab], got shape {tuple(logits.shape)}")
    if logits.stride(-1) != 1:
        logits = logits.contiguous()
    partials_kernel, merge_kernel, next_pow2 = _kernels()
    rows, vocab = logits.shape
    splits, split_size = split_plan(rows, vocab, block)
    f32 = {"dtype": torch.float32, "device": logits.device}
    m = torch.empty(rows, splits, **f32)
    s = torch.empty(rows, splits, **f32)
    t = torch.empty(rows, splits, **f32)
    out = torch.empty(rows, **f32)
    if rows == 0:
        return out
    partials_kernel[(rows, splits)](logits, logits.stride(0), vocab, split_size, m, s, t, splits, BLOCK=block)
    merge_kernel[(rows,)](m, s, t, out, splits, SPLITS=next_pow2(splits))
    return out


# --- what the tap uses -------------------------------------------------------------------------
def entropy_function(device: torch.device, keep_for_surprisal: bool = False, compiled: bool = True) -> EntropyFn:
    """The entropy reduction the tap runs on ``device``: the fused Triton kernel on CUDA (when Triton
    is importable; the reference if the kernel fails there); on a CPU the same algorithm as a C++
    kernel built on the node (``native_entropy``) when torch runs one thread, as vLLM's CPU engine
    does on small hosts, else compiled by ``torch.compile`` (``compiled_entropy``; it splits rows
    across threads), or with ``compiled=False`` the one-chunk torch form with
    kept buffers (the fastest of the uncompiled CPU forms; `entroloop bench collector` times them all
    side by side).

    ``keep_for_surprisal``: the result also has ``surprisal(rows, tokens)`` for the last call's
    logits (the CPU forms keep their shifted logits; elsewhere ``KeptLogits`` keeps a copy)."""
    if torch.device(device).type != "cuda":
        if compiled:
            # imported here: both build on this module's constants and fallback
            if torch.get_num_threads() == 1:
                from entroloop.collectors.vllm.native_entropy import (
                    NativeShiftedEntropy,
                )

                return NativeShiftedEntropy(keep_for_surprisal=keep_for_surprisal)
            from entroloop.collectors.vllm.compiled_entropy import (
                CompiledShiftedEntropy,
            )

            return CompiledShiftedEntropy(keep_for_surprisal=keep_for_surprisal)
        return BufferedShiftedEntropy(keep_for_surprisal=keep_for_surprisal)
    fn = _device_entropy_function()
    return KeptLogits(fn) if keep_for_surprisal else fn


def _device_entropy_function() -> EntropyFn:
    if not triton_available():
        return entropy_per_row
    state = {"fn": entropy_per_row_triton}

    def fused_or_reference(logits: torch.Tensor) -> torch.Tensor:
        try:
            return state["fn"](logits)
        except Exception:
            if state["fn"] is entropy_per_row:
                raise
            log.exception("entroloop entropy tap: the fused Triton kernel failed; using the reference from now on")
            state["fn"] = entropy_per_row
            return entropy_per_row(logits)

    return fused_or_reference
