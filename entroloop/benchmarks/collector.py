"""`entroloop bench collector`'s repetition: rounds of ``entroloop.collectors.vllm.bench`` (plain / tap / top-20
passes taking turns in one engine process per round) repeated with ``entroloop.benchmarks.repeats``, and the entropy
reduction alone timed on this machine's CPU and, when CUDA is available, on the GPU — where the
fused Triton kernel (``entroloop.collectors.vllm.fused_entropy``) is timed beside the reference, so a session
with a GPU just runs the command.

Needs torch and vLLM (.venv-ml) when it runs; importing it needs neither.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any

from entroloop.benchmarks.repeats import DEFAULT_RUNS, repeat, repeat_many
from entroloop.collectors.vllm.bench import (
    Workload,
    cached_model,
    round_figures,
    run_round,
)

LOGIT_SCALE = 20.0


def run(work: Workload, runs: int = DEFAULT_RUNS, python: str = sys.executable, model: Path | None = None,
        progress: Callable[[str], None] = lambda message: None) -> dict:
    """``runs`` rounds of every variant (a fresh engine process per round, the order alternating from
    round to round so a slow drift of the machine does not favour one); the median, spread and load
    of each figure across rounds, and the tap's reduction alone on this machine."""
    model = model or cached_model(work)
    details: dict = {}
    round_no = 0

    def one_round() -> dict[str, float]:
        nonlocal round_no
        order = work.variants if round_no % 2 == 0 else tuple(reversed(work.variants))
        round_no += 1
        progress(f"{work.shape}: round {round_no}/{runs} ({' / '.join(order)} in one engine process)")
        with tempfile.TemporaryDirectory(prefix="entroloop-bench-") as scratch:
            numbers, round_details = round_figures(work, run_round(work, model, Path(scratch), python, order))
        details.update({k: v for k, v in round_details.items() if k not in details or v is not None})
        return numbers

    repeated = repeat_many(one_round, runs)
    progress(f"{work.shape}: timing the entropy reduction alone")
    return {"workload": asdict(work), "steps": work.steps, "repeated": repeated, "details": details,
            "reduction": reduction_timings_as_the_engine_runs(work.max_num_seqs, work.vocab, runs=runs)}


def tap_step(device: Any, rows: int, vocab: int, surprisal: bool,
             temperature: float | None = None) -> Callable[[Any], None]:
    """One engine step as the tap sees it: ``on_logits`` for ``rows`` running requests, then vLLM
    samples a token for each (appended to their id lists, which the next step's gather reads).
    ``temperature``: every request sampled at it (None: greedy, no sampling entropies)."""
    from entroloop.collectors.vllm.ledger import AddedRow
    from entroloop.collectors.vllm.tap import EntropyTap

    tap = EntropyTap(lambda chunk: None, device, max_rows=rows, surprisal=surprisal)
    ids: list[list[int]] = [[] for _ in range(rows)]
    tap.on_batch_update([], [AddedRow(i, f"bench-{i}", "", ids[i], temperature) for i in range(rows)], [])

    def step(logits: Any) -> None:
        tap.on_logits(logits)
        for i, sampled in enumerate(ids):
            sampled.append((len(sampled) * 7919 + i) % vocab)
        tap._credit_landed(block=True)  # the values on the host, as the next step would find them

    return step


def reduction_timings(rows: int, vocab: int, runs: int = DEFAULT_RUNS, calls: int = 30) -> dict:
    """µs per call of each entropy reduction on ``[rows, vocab]`` float32 logits, on this machine's
    CPU and, when CUDA is available, on the GPU (the fused Triton kernel there). Median of ``calls``
    calls per run, repeated ``runs`` times."""
    import torch

    from entroloop.collectors.vllm.compiled_entropy import CompiledShiftedEntropy
    from entroloop.collectors.vllm.entropy import entropy_per_row
    from entroloop.collectors.vllm.fused_entropy import (
        BufferedShiftedEntropy,
        entropy_per_row_chunked,
        entropy_per_row_shifted,
        entropy_per_row_triton,
        triton_available,
    )
    from entroloop.collectors.vllm.native_entropy import NativeShiftedEntropy

    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    timings: dict = {}
    for device in devices:
        gen = torch.Generator().manual_seed(0)
        # scale 20: a confident model's long tail, a quarter of the logits where exp() is subnormal
        logits = (torch.randn(rows, vocab, generator=gen) * LOGIT_SCALE).to(device)
        candidates = {"reference": entropy_per_row, "fused_torch_one_chunk": entropy_per_row_shifted,
                      "fused_torch_one_chunk_buffered": BufferedShiftedEntropy(),
                      "fused_torch_chunked": entropy_per_row_chunked}
        if device == "cpu":  # the same algorithm as one loop nest (torch.compile) and as the C++ kernel
            candidates["fused_torch_compiled"] = CompiledShiftedEntropy(keep_for_surprisal=True)
            candidates["fused_native"] = NativeShiftedEntropy(keep_for_surprisal=True)
        if device == "cuda" and triton_available():
            candidates["fused_triton"] = entropy_per_row_triton
        # the tap's whole step (reduction, ledger, hand-off to the host), without and with the
        # one-step-late surprisals: what keeping the logits and gathering the sampled tokens costs
        candidates["tap_step_entropy_only"] = tap_step(torch.device(device), rows, vocab, surprisal=False)
        candidates["tap_step_with_surprisals"] = tap_step(torch.device(device), rows, vocab, surprisal=True)
        # ... and every request sampled at T=1.5: the sampling entropies' own pass over each row
        candidates["tap_step_sampled_at_t1.5"] = tap_step(torch.device(device), rows, vocab, surprisal=True,
                                                          temperature=1.5)
        for name, fn in candidates.items():
            fn(logits)  # warm-up (and the Triton compile)

            def measure(fn=fn, device=device, logits=logits) -> float:
                samples = []
                for _ in range(calls):
                    if device == "cuda":
                        torch.cuda.synchronize()
                    start = time.perf_counter()
                    fn(logits)
                    if device == "cuda":
                        torch.cuda.synchronize()
                    samples.append((time.perf_counter() - start) * 1e6)
                return statistics.median(samples)

            timings[f"{device}:{name}"] = repeat(measure, runs)
    return timings


def reduction_timings_as_the_engine_runs(rows: int, vocab: int, runs: int = DEFAULT_RUNS) -> dict:
    """``reduction_timings`` with one torch thread, as vLLM's CPU engine runs the tap on a small host
    (the tap picks its CPU form by the thread count when it is built, so the whole run is at one)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return reduction_timings(rows, vocab, runs)
    finally:
        torch.set_num_threads(threads)
