"""The single-pass entropy forms (entroloop.collectors.vllm.fused_entropy) against a float64 log_softmax reference.

The Triton kernel runs here on the CPU under ``TRITON_INTERPRET=1`` in a child process (Triton reads
the switch when a kernel is defined, and this process may already have defined it compiled); the
torch forms run in this process. Marked ``vllm``: needs torch (and Triton), so it runs in .venv-ml.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm

ROOT = Path(__file__).resolve().parents[3]
TOLERANCE = 5e-5  # nats, as the reference's own accuracy test


CASES = ("scale0.01", "scale1", "scale4", "scale30", "shift+5000", "shift-10000", "masked", "bfloat16",
         "float16", "tiny_vocab", "one_row_big_vocab")


def reference(logits):
    """Entropy in float64 from log_softmax; masked tokens (p = 0) contribute 0; an all-masked row is NaN."""
    import torch

    logp = torch.log_softmax(logits.double(), dim=-1)
    p = logp.exp()
    return -(p * logp.masked_fill(p == 0, 0.0)).sum(dim=-1)


def cases() -> dict:
    """Random logits at several scales and dtypes, vocabularies off any block size, -inf masks."""
    import torch

    gen = torch.Generator().manual_seed(11)
    out: dict = {}
    for name, scale, shift in (("scale0.01", 0.01, 0.0), ("scale1", 1.0, 0.0), ("scale4", 4.0, 0.0),
                               ("scale30", 30.0, 0.0), ("shift+5000", 10.0, 5000.0), ("shift-10000", 3.0, -1e4)):
        out[name] = torch.randn(4, 50_001, generator=gen) * scale + shift
    masked = torch.randn(6, 20_003, generator=gen) * 5
    masked[0, 1:] = -math.inf  # one token left: entropy exactly 0
    masked[1, ::2] = -math.inf  # every other token
    masked[2, :17_000] = -math.inf  # whole chunks and blocks masked, the maximum late in the row
    masked[3, 5_000:] = -math.inf  # whole chunks and blocks masked at the end
    masked[4, :] = -math.inf  # nothing left: NaN, as the reference
    out["masked"] = masked
    for dtype in (torch.bfloat16, torch.float16):
        x = (torch.randn(5, 32_771, generator=gen) * 6).to(dtype)
        x[1, 7:] = -math.inf
        out[f"{dtype}".removeprefix("torch.")] = x
    out["tiny_vocab"] = torch.randn(3, 5, generator=gen)
    out["one_row_big_vocab"] = torch.randn(1, 151_936, generator=gen) * 4
    assert tuple(out) == CASES
    return out


def assert_agrees(got, logits, name: str) -> None:
    import torch

    expected = reference(logits)
    assert got.dtype == torch.float32 and got.shape == expected.shape, name
    nan = torch.isnan(expected)
    assert torch.equal(torch.isnan(got), nan), f"{name}: NaN rows differ: {got} vs {expected}"
    error = (got.double() - expected)[~nan].abs().max().item() if (~nan).any() else 0.0
    assert error < TOLERANCE, f"{name}: max error {error:.3g} nats"


@pytest.mark.parametrize("name", CASES)
def test_torch_forms_agree_with_the_reference(name: str) -> None:
    from entroloop.collectors.vllm.fused_entropy import (
        BufferedShiftedEntropy,
        entropy_per_row_chunked,
        entropy_per_row_shifted,
    )

    logits = cases()[name]
    assert_agrees(entropy_per_row_shifted(logits), logits, f"one chunk, {name}")
    assert_agrees(BufferedShiftedEntropy(block_rows=3)(logits), logits, f"one chunk, kept buffers, {name}")
    assert_agrees(entropy_per_row_chunked(logits), logits, f"chunked, {name}")
    assert_agrees(entropy_per_row_chunked(logits, chunk=4096), logits, f"chunked by 4096, {name}")


@pytest.mark.parametrize("name", CASES)
def test_the_compiled_cpu_form_agrees_with_the_reference(name: str) -> None:
    from entroloop.collectors.vllm.compiled_entropy import CompiledShiftedEntropy

    logits = cases()[name]
    for keep in (False, True):
        compiled = CompiledShiftedEntropy(keep_for_surprisal=keep)
        assert_agrees(compiled(logits), logits, f"compiled, keep_for_surprisal={keep}, {name}")
        assert compiled.fallback is None, "it must have run compiled, not fallen back"


@pytest.mark.parametrize("name", CASES)
def test_the_native_cpu_form_agrees_with_the_reference(name: str) -> None:
    from entroloop.collectors.vllm.native_entropy import NativeShiftedEntropy

    logits = cases()[name]
    for keep in (False, True):
        native = NativeShiftedEntropy(keep_for_surprisal=keep)
        assert_agrees(native(logits), logits, f"native, keep_for_surprisal={keep}, {name}")
        assert native.fallback is None, "it must have run the kernel, not fallen back"
    column_slice = logits.t().contiguous().t()  # rows not contiguous: copied, not misread
    assert_agrees(NativeShiftedEntropy()(column_slice), logits, f"native, column-major, {name}")


@pytest.mark.parametrize("name", CASES)
def test_the_chunked_form_at_a_sampling_temperature_agrees_with_the_reference_of_scaled_logits(name: str) -> None:
    """What the tap ships as sampling entropy: chosen rows, each at its own temperature."""
    import torch
    from entroloop.collectors.vllm.fused_entropy import (
        TemperatureEntropy,
        entropy_per_row_chunked,
    )

    logits = cases()[name]
    picked = list(range(logits.shape[0]))[::-1][: max(1, logits.shape[0] - 1)]  # reordered, one left out
    temperatures = [(0.7, 1.5, 2.0, 0.3, 1.0, 5.0)[i % 6] for i in range(len(picked))]
    rows = torch.tensor(picked, dtype=torch.long)
    inverse = 1.0 / torch.tensor(temperatures, dtype=torch.float32)
    scaled = logits.double()[rows] * inverse.double()[:, None]
    for chunk in (4096, 1 << 20):
        got = entropy_per_row_chunked(logits, chunk=chunk, rows=rows, inverse_temperature=inverse)
        assert_agrees(got, scaled, f"chunked by {chunk} at temperatures {temperatures}, {name}")
    # what the tap runs on a CPU: the one-chunk form, row by row into kept buffers (twice: reused)
    at_temperatures = TemperatureEntropy(torch.device("cpu"))
    for attempt in range(2):
        got = at_temperatures(logits, picked, temperatures)
        assert_agrees(got, scaled, f"one chunk per row at temperatures {temperatures}, {name}, call {attempt}")
    # ... or, at one torch thread, the C++ kernel, which must leave what it kept for surprisals alone
    from entroloop.collectors.vllm.native_entropy import NativeShiftedEntropy

    native = NativeShiftedEntropy(keep_for_surprisal=True)
    native(logits)
    n = logits.shape[0]  # the kept buffers hold at least 8 rows; the others are not this call's
    kept = (native._z[:n].clone(), native._shift[:n].clone(), list(native._log2_sum_list))
    assert_agrees(native.at_temperatures(logits, picked, temperatures), scaled,
                  f"native at temperatures {temperatures}, {name}")
    assert native.fallback is None
    assert torch.equal(native._z[:n], kept[0]) and torch.equal(native._shift[:n], kept[1])
    assert native._log2_sum_list == kept[2]
    if name == "scale4":  # hotter is flatter: a higher entropy for every row
        base = entropy_per_row_chunked(logits, rows=rows)
        hot = entropy_per_row_chunked(logits, rows=rows, inverse_temperature=torch.full((len(picked),), 0.5))
        assert bool((hot > base + 0.01).all())


def test_a_sampling_temperature_per_row_must_match_the_rows() -> None:
    import torch
    from entroloop.collectors.vllm.fused_entropy import entropy_per_row_chunked

    with pytest.raises(ValueError, match="one value per row"):
        entropy_per_row_chunked(torch.zeros(3, 10), inverse_temperature=torch.ones(2))


def test_a_single_remaining_token_gives_exactly_zero() -> None:
    import torch
    from entroloop.collectors.vllm.fused_entropy import (
        entropy_per_row_chunked,
        entropy_per_row_shifted,
    )

    logits = torch.full((2, 1000), -math.inf)
    logits[0, 3] = 50.0
    logits[1, 999] = -50.0
    assert entropy_per_row_chunked(logits, chunk=64).tolist() == [0.0, 0.0]
    # the one-chunk form floors x - max at -87 (no subnormal exp): 999 masked tokens add < 1e-33;
    # its shift folds log2(e) into one rounded multiply-add, so the max lands within an ulp of 0
    assert all(0.0 <= h < 1e-7 for h in entropy_per_row_shifted(logits).tolist())


def test_the_logits_are_left_unchanged() -> None:
    import torch
    from entroloop.collectors.vllm.compiled_entropy import CompiledShiftedEntropy
    from entroloop.collectors.vllm.fused_entropy import (
        entropy_per_row_chunked,
        entropy_per_row_shifted,
    )

    logits = torch.randn(3, 10_000)
    logits[0, :10] = -math.inf
    before = logits.clone()
    entropy_per_row_shifted(logits)
    entropy_per_row_chunked(logits, chunk=1000)
    CompiledShiftedEntropy(keep_for_surprisal=True)(logits)
    assert torch.equal(logits, before)


def test_split_plan_covers_the_vocabulary_in_whole_blocks() -> None:
    from entroloop.collectors.vllm.fused_entropy import split_plan

    for rows, vocab in ((1, 151_936), (8, 151_936), (256, 151_936), (4, 1000), (3, 5), (1, 1024)):
        splits, size = split_plan(rows, vocab, block=1024)
        assert size % 1024 == 0 and splits * size >= vocab > (splits - 1) * size, (rows, vocab)
    assert split_plan(8, 151_936)[0] >= 8  # a decode batch still spreads over many programs
    assert split_plan(512, 151_936)[0] == 1  # a big batch: one program per row


CHILD = """
import sys, torch
from entroloop.collectors.vllm.fused_entropy import entropy_per_row_triton
cases = torch.load(sys.argv[1])
torch.save({name: (entropy_per_row_triton(x), entropy_per_row_triton(x, block=256)) for name, x in cases.items()},
           sys.argv[2])
"""


def test_the_triton_kernel_agrees_with_the_reference_under_the_interpreter(tmp_path: Path) -> None:
    import torch
    import triton  # noqa: F401 - installed with torch in .venv-ml: without it this test must fail

    inputs, outputs = tmp_path / "cases.pt", tmp_path / "results.pt"
    all_cases = cases()
    torch.save(all_cases, inputs)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", CHILD, str(inputs), str(outputs)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = torch.load(outputs)
    assert set(results) == set(all_cases)
    for name, (default_block, small_block) in results.items():
        assert_agrees(default_block, all_cases[name], f"triton, {name}")
        assert_agrees(small_block, all_cases[name], f"triton block 256, {name}")


def test_the_tap_uses_a_built_kernel_on_a_cpu_and_the_triton_kernel_on_cuda(monkeypatch) -> None:
    import torch
    from entroloop.collectors.vllm import fused_entropy
    from entroloop.collectors.vllm.compiled_entropy import CompiledShiftedEntropy
    from entroloop.collectors.vllm.fused_entropy import (
        BufferedShiftedEntropy,
        entropy_function,
    )
    from entroloop.collectors.vllm.native_entropy import NativeShiftedEntropy
    from entroloop.collectors.vllm.tap import EntropyTap

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)  # as vLLM's CPU engine runs on a small host: the native kernel
        assert isinstance(entropy_function(torch.device("cpu")), NativeShiftedEntropy)
        native_tap = EntropyTap(lambda chunk: None, torch.device("cpu"), max_rows=4)
        assert isinstance(native_tap.entropy, NativeShiftedEntropy)
        assert native_tap.entropy_at_temperatures == native_tap.entropy.at_temperatures  # its sampling pass too
        torch.set_num_threads(2)  # several threads: the compiled form, which splits rows across them
        assert isinstance(entropy_function(torch.device("cpu")), CompiledShiftedEntropy)
        assert isinstance(EntropyTap(lambda chunk: None, torch.device("cpu"), max_rows=4).entropy, CompiledShiftedEntropy)
    finally:
        torch.set_num_threads(threads)
    assert isinstance(entropy_function(torch.device("cpu"), compiled=False), BufferedShiftedEntropy)
    uncompiled = EntropyTap(lambda chunk: None, torch.device("cpu"), max_rows=4, compiled=False)
    assert isinstance(uncompiled.entropy, BufferedShiftedEntropy)
    monkeypatch.setattr(fused_entropy, "triton_available", lambda: False)
    assert entropy_function(torch.device("cuda")) is fused_entropy.entropy_per_row


def test_a_failing_kernel_falls_back_to_the_reference_for_good(monkeypatch) -> None:
    import torch
    from entroloop.collectors.vllm import fused_entropy
    from entroloop.collectors.vllm.fused_entropy import entropy_function

    calls: list[int] = []

    def broken(logits):
        calls.append(1)
        raise RuntimeError("no kernel for this GPU")

    monkeypatch.setattr(fused_entropy, "triton_available", lambda: True)
    monkeypatch.setattr(fused_entropy, "entropy_per_row_triton", broken)
    fn = entropy_function(torch.device("cuda"))
    logits = torch.randn(2, 300)
    for _ in range(3):
        assert_agrees(fn(logits), logits, "fallback")
    assert calls == [1]  # tried once, then the reference from then on


def test_a_compiled_form_that_cannot_compile_falls_back_to_the_torch_ops_for_good(caplog) -> None:
    """No C++ compiler on the node, an Inductor bug: logged once, the torch-op form from then on,
    surprisals included (read from the form that ran the last call)."""
    import torch
    from entroloop.collectors.vllm.compiled_entropy import CompiledShiftedEntropy
    from entroloop.collectors.vllm.fused_entropy import BufferedShiftedEntropy

    calls: list[int] = []

    def broken(*args):
        calls.append(1)
        raise RuntimeError("InvalidCxxCompiler: No working C++ compiler found")

    fn = CompiledShiftedEntropy(keep_for_surprisal=True)
    fn._kernel = broken
    logits = torch.randn(4, 3000) * 5
    for _ in range(3):
        assert_agrees(fn(logits), logits, "fallback")
    assert calls == [1] and isinstance(fn.fallback, BufferedShiftedEntropy)
    assert "compiled CPU reduction failed" in caplog.text
    expected = reference_surprisal(logits, [2, 0], [7, 11])
    assert torch.allclose(fn.surprisal([2, 0], [7, 11]).double(), expected, atol=1e-4)


def test_compiled_kernels_are_not_loaded_from_a_cache_others_can_write(tmp_path, monkeypatch, caplog) -> None:
    """Inductor loads its cached shared libraries into the engine: a cache folder another user made
    (or may write to) would let them run code there. The tap refuses it, says how to fix it, and
    still measures with the torch-op form."""
    import torch
    from entroloop.collectors.vllm import compiled_entropy
    from entroloop.collectors.vllm.compiled_entropy import (
        CompiledShiftedEntropy,
        unsafe_cache_reason,
    )
    from entroloop.collectors.vllm.fused_entropy import BufferedShiftedEntropy

    shared = tmp_path / "torchinductor_shared"
    shared.mkdir()
    shared.chmod(0o777)
    assert "writable by other users" in unsafe_cache_reason(str(shared))
    monkeypatch.setattr(compiled_entropy, "_inductor_cache_dir", lambda: str(shared))
    fn = CompiledShiftedEntropy(keep_for_surprisal=True)
    assert isinstance(fn.fallback, BufferedShiftedEntropy)
    assert "TORCHINDUCTOR_CACHE_DIR" in caplog.text and "writable by other users" in caplog.text
    logits = torch.randn(3, 2000) * 4
    assert_agrees(fn(logits), logits, "torch-op form behind a refused cache")
    assert torch.allclose(fn.surprisal([1], [5]).double(), reference_surprisal(logits, [1], [5]), atol=1e-4)

    shared.chmod(0o700)  # this user's alone: compiled
    assert unsafe_cache_reason(str(shared)) is None
    monkeypatch.setattr(compiled_entropy.os, "getuid", lambda: 12345)  # ... unless someone else owns it
    assert "belongs to uid" in unsafe_cache_reason(str(shared))


def test_the_cpu_tap_keeps_its_buffers_between_steps_and_any_batch_size_fits() -> None:
    import torch
    from entroloop.collectors.vllm.entropy import entropy_per_row
    from entroloop.collectors.vllm.fused_entropy import (
        BufferedShiftedEntropy,
        entropy_function,
    )

    entropy = entropy_function(torch.device("cpu"), compiled=False)
    assert isinstance(entropy, BufferedShiftedEntropy)
    gen = torch.Generator().manual_seed(3)
    first = entropy(torch.randn(5, 3000, generator=gen) * 20)
    buffers = (entropy._z.data_ptr(), entropy._e.data_ptr())
    for rows in (1, 8, 19, 0):  # fewer, exactly a block, several blocks, an empty step
        logits = torch.randn(rows, 3000, generator=gen) * 20
        got = entropy(logits)
        assert got.shape == (rows,)
        assert torch.allclose(got, entropy_per_row(logits), atol=1e-4)
        assert (entropy._z.data_ptr(), entropy._e.data_ptr()) == buffers  # no new [rows, vocab] memory
    assert first.shape == (5,) and entropy._z.shape == (8, 3000)
    entropy(torch.randn(2, 4096, generator=gen))  # another vocabulary: buffers of its width
    assert entropy._z.shape == (8, 4096)


def test_the_compiled_form_keeps_its_float16_shifts_between_steps_and_grows_for_a_larger_batch() -> None:
    import torch
    from entroloop.collectors.vllm.compiled_entropy import CompiledShiftedEntropy
    from entroloop.collectors.vllm.entropy import entropy_per_row

    entropy = CompiledShiftedEntropy(keep_for_surprisal=True)
    gen = torch.Generator().manual_seed(3)
    entropy(torch.randn(5, 3000, generator=gen) * 20)
    kept = entropy._z.data_ptr()
    assert entropy._z.shape == (8, 3000) and entropy._z.dtype == torch.float16
    for rows in (1, 8, 0):
        logits = torch.randn(rows, 3000, generator=gen) * 20
        assert torch.allclose(entropy(logits), entropy_per_row(logits), atol=1e-4)
        assert entropy._z.data_ptr() == kept  # no new [rows, vocab] memory
    logits = torch.randn(19, 3000, generator=gen) * 20
    assert torch.allclose(entropy(logits), entropy_per_row(logits), atol=1e-4)
    assert entropy._z.shape == (19, 3000)  # grown to the larger batch, then kept
    with pytest.raises(IndexError, match="outside the vocabulary"):
        entropy.surprisal([0], [3000])


def reference_surprisal(logits, rows, tokens):
    """-log_softmax in float64 at (rows[i], tokens[i])."""
    import torch

    logp = torch.log_softmax(logits.double(), dim=-1)
    return -logp[torch.as_tensor(rows), torch.as_tensor(tokens)]


def kept_form(form: str):
    from entroloop.collectors.vllm.compiled_entropy import CompiledShiftedEntropy
    from entroloop.collectors.vllm.entropy import entropy_per_row
    from entroloop.collectors.vllm.fused_entropy import (
        BufferedShiftedEntropy,
        KeptLogits,
    )
    from entroloop.collectors.vllm.native_entropy import NativeShiftedEntropy

    return {"cpu-kept-shifted": lambda: BufferedShiftedEntropy(keep_for_surprisal=True),
            "cpu-compiled": lambda: CompiledShiftedEntropy(keep_for_surprisal=True),
            "cpu-native": lambda: NativeShiftedEntropy(keep_for_surprisal=True),
            "kept-logits": lambda: KeptLogits(entropy_per_row)}[form]()


# The compiled and native forms keep their shifted logits in float16: a surprisal may be off by its own relative
# float16 rounding (2^-11), which the wire format (float16) rounds it to anyway
FLOAT16_RELATIVE = 2.0**-11


@pytest.mark.parametrize("form", ["cpu-kept-shifted", "cpu-compiled", "cpu-native", "kept-logits"])
def test_kept_forms_give_the_last_steps_surprisals_and_the_same_entropies(form: str) -> None:
    """What the tap gathers one step late: -log p(token) of the last call's rows, for rows in any
    block, at every scale, with masked tokens; the entropies are those of the plain forms."""
    import torch
    from entroloop.collectors.vllm.entropy import entropy_per_row

    fn = kept_form(form)
    gen = torch.Generator().manual_seed(5)
    for rows, scale in ((19, 1.0), (3, 30.0), (12, 4.0)):  # several blocks, fewer rows, then more again
        logits = torch.randn(rows, 5001, generator=gen) * scale
        logits[1, 4000:] = -math.inf
        got = fn(logits)
        assert torch.allclose(got, entropy_per_row(logits), atol=1e-4)
        picked_rows = list(range(rows))[::-1] + [1]
        # every other token among the row's 50 likeliest (what a sampler picks), the rest anywhere
        top = logits.topk(50, dim=-1).indices
        tokens = [int(top[r, int(torch.randint(0, 50, (1,), generator=gen))]) if i % 2 else
                  int(torch.randint(0, 4000, (1,), generator=gen)) for i, r in enumerate(picked_rows)]
        tokens[0] = int(logits[picked_rows[0]].argmax())  # the likeliest token: surprisal near its floor
        surprisal = fn.surprisal(picked_rows, tokens)
        expected = reference_surprisal(logits, picked_rows, tokens)
        assert surprisal.dtype == torch.float32
        # A token more than 87 nats below the top is floored by the CPU form (never sampled: p < e^-87)
        sampleable = expected < 80
        assert sampleable.sum() >= 2, "the case must hold tokens a sampler could pick"
        relative = FLOAT16_RELATIVE if form in ("cpu-compiled", "cpu-native") else 0.0
        error = ((surprisal.double() - expected).abs() - relative * expected)[sampleable].max().item()
        assert error < 1e-4 * max(1.0, scale), (form, rows, scale, error)
        assert (surprisal[~sampleable] >= 80).all()
    # a token masked to -inf: the CPU form floors it (~87 nats or more), the copy gives inf
    masked = fn.surprisal([1], [4500]).item()
    assert masked > 80


def test_the_tap_asks_for_kept_logits_only_when_surprisals_are_on() -> None:
    import torch
    from entroloop.collectors.vllm.compiled_entropy import CompiledShiftedEntropy
    from entroloop.collectors.vllm.fused_entropy import (
        BufferedShiftedEntropy,
        entropy_function,
    )
    from entroloop.collectors.vllm.native_entropy import NativeShiftedEntropy

    threads = torch.get_num_threads()
    for compiled, form, torch_threads in ((True, CompiledShiftedEntropy, 2), (True, NativeShiftedEntropy, 1),
                                          (False, BufferedShiftedEntropy, threads)):
        torch.set_num_threads(torch_threads)
        try:
            kept = entropy_function(torch.device("cpu"), keep_for_surprisal=True, compiled=compiled)
            plain = entropy_function(torch.device("cpu"), compiled=compiled)
        finally:
            torch.set_num_threads(threads)
        assert isinstance(kept, form) and kept.keep_for_surprisal
        assert isinstance(plain, form) and not plain.keep_for_surprisal
        plain(torch.randn(2, 10))
        with pytest.raises(RuntimeError, match="keep_for_surprisal"):
            plain.surprisal([0], [0])


def test_a_forced_tokens_surprisal_is_never_below_zero() -> None:
    """A token with p ~ 1 (logit_bias +100, or a very confident model): the base-2 shift leaves the
    max's z within an ulp of 0, and half such surprisals read ~-1e-7 before they were clamped — which
    TokenEntropy refuses (the acceptance test's engine stopped on it)."""
    import torch

    gen = torch.Generator().manual_seed(0)
    for form in ("cpu-kept-shifted", "cpu-compiled", "cpu-native"):
        entropy = kept_form(form)
        for trial in range(50):
            logits = torch.randn(4, 5000, generator=gen) * 3
            forced = int(torch.randint(0, 5000, (1,), generator=gen))
            logits[:, forced] += 100 + trial * 0.37
            assert (entropy(logits) >= 0).all()
            surprisal = entropy.surprisal([0, 1, 2, 3], [forced] * 4)
            assert (surprisal >= 0).all() and (surprisal < 1e-6).all(), (form, trial, surprisal)
