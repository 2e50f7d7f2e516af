"""Building and loading the tap's C++ kernel (entroloop.collectors.vllm.native_entropy): the cache
that only this user can write, reuse, refusal, and falling back when no kernel can be had.

Its numbers against the float64 reference are in test_fused_entropy.py with the other forms.
Marked ``vllm``: needs torch, so it runs in .venv-ml.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

pytestmark = pytest.mark.vllm


def entropy_reference(logits):
    import torch

    logp = torch.log_softmax(logits.double(), dim=-1)
    return -(logp.exp() * logp).sum(dim=-1)


def test_the_library_is_built_once_private_and_read_only_then_reused(tmp_path: Path) -> None:
    from entroloop.collectors.vllm.native_entropy import build_library

    folder = tmp_path / "native"
    library = build_library(folder)
    assert library.parent == folder and library.suffix == ".so"
    assert os.stat(folder).st_mode & 0o777 == 0o700
    assert os.stat(library).st_mode & 0o777 == 0o500  # nobody rewrites a library the engine loads
    built_at = os.stat(library).st_mtime_ns
    assert build_library(folder) == library and os.stat(library).st_mtime_ns == built_at
    assert [p.name for p in folder.iterdir()] == [library.name]  # no scratch left behind


def test_a_build_for_another_cpu_or_source_gets_another_name(monkeypatch) -> None:
    """-march=native code from a machine with other instructions must never be loaded here."""
    from entroloop.collectors.vllm import native_entropy

    compiler = native_entropy._compiler()
    key = native_entropy._library_key(compiler, b"source")
    assert native_entropy._library_key(compiler, b"source") == key
    assert native_entropy._library_key(compiler, b"other source") != key
    monkeypatch.setattr(native_entropy, "_cpu_flags", lambda: "flags : fpu sse2")
    assert native_entropy._library_key(compiler, b"source") != key


def test_a_cache_folder_others_can_write_is_refused_and_the_tap_still_measures(
    tmp_path: Path, monkeypatch, caplog
) -> None:
    """The library is loaded into the serving engine: whoever can write the folder could run code
    there. Refused with the fix named; the compiled form measures instead."""
    import torch
    from entroloop.collectors.vllm import native_entropy
    from entroloop.collectors.vllm.compiled_entropy import CompiledShiftedEntropy
    from entroloop.collectors.vllm.native_entropy import (
        NativeBuildError,
        NativeShiftedEntropy,
        build_library,
    )

    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    # make_private_dir tightens a folder of ours; one of another account's stays as it is
    monkeypatch.setattr(native_entropy, "make_private_dir", lambda folder: folder)
    with pytest.raises(NativeBuildError, match="writable by other users"):
        build_library(shared)
    entropy = NativeShiftedEntropy(keep_for_surprisal=True, folder=shared)
    logits = torch.randn(3, 4000) * 4
    assert torch.allclose(entropy(logits).double(), entropy_reference(logits), atol=1e-4)
    assert isinstance(entropy.fallback, CompiledShiftedEntropy)
    assert "XDG_CACHE_HOME" in caplog.text and "writable by other users" in caplog.text
    assert not any(p.suffix == ".so" for p in shared.iterdir())


def test_a_library_someone_else_could_rewrite_is_not_loaded(tmp_path: Path) -> None:
    from entroloop.collectors.vllm.native_entropy import NativeBuildError, build_library

    library = build_library(tmp_path / "native")
    library.chmod(0o777)
    with pytest.raises(NativeBuildError, match="writable by other users"):
        build_library(tmp_path / "native")


def test_without_a_compiler_the_tap_says_so_and_uses_the_compiled_form(tmp_path: Path, monkeypatch, caplog) -> None:
    import torch
    from entroloop.collectors.vllm.compiled_entropy import CompiledShiftedEntropy
    from entroloop.collectors.vllm.native_entropy import NativeShiftedEntropy

    monkeypatch.setenv("CXX", "no-such-compiler-here")
    entropy = NativeShiftedEntropy(keep_for_surprisal=True, folder=tmp_path / "native")
    entropy.warm_up(300)
    assert isinstance(entropy.fallback, CompiledShiftedEntropy)
    assert "no C++ compiler 'no-such-compiler-here'" in caplog.text and "ENTROLOOP_ENTROPY_TAP_COMPILED" in caplog.text
    logits = torch.randn(2, 300) * 3
    with torch.inference_mode():  # as vLLM calls it (the warm-up's buffers are inference tensors)
        assert torch.allclose(entropy(logits).double(), entropy_reference(logits), atol=1e-4)
        surprisal = entropy.surprisal([1], [7]).item()
    expected = -torch.log_softmax(logits.double(), dim=-1)[1, 7]
    assert abs(surprisal - expected.item()) < 2.0**-11 * expected.item()  # from the form that ran (float16 shifts)
    with torch.inference_mode():  # the sampling pass falls back as well
        hot = entropy.at_temperatures(logits, [1], [2.0])
    assert abs(hot.item() - entropy_reference(logits[1:] / 2.0).item()) < 1e-4


def test_what_the_kernel_cannot_read_is_refused(tmp_path: Path) -> None:
    import torch
    from entroloop.collectors.vllm.native_entropy import NativeShiftedEntropy

    entropy = NativeShiftedEntropy(folder=tmp_path / "native")
    # the kernel reads raw host pointers: anything but a [rows, vocab] host tensor is refused, not read
    with pytest.raises(ValueError, match="host memory; got logits on meta"):
        entropy(torch.empty(2, 100, device="meta"))
    with pytest.raises(ValueError, match="host memory"):
        entropy.at_temperatures(torch.empty(2, 100, device="meta"), [0], [0.7])
    with pytest.raises(ValueError, match=r"\[rows, vocab\]"):
        entropy(torch.randn(100))
    with pytest.raises(IndexError, match="outside the batch"):
        entropy.at_temperatures(torch.randn(2, 100), [2], [0.7])  # never a read past the logits
    assert entropy.at_temperatures(torch.randn(2, 100), [], []).shape == (0,)


def test_a_compile_error_is_reported_with_the_compilers_words(tmp_path: Path, monkeypatch) -> None:
    from entroloop.collectors.vllm import native_entropy

    broken = tmp_path / "entropy_rows.cpp"
    broken.write_text("this is not C++\n")
    monkeypatch.setattr(native_entropy, "SOURCE", broken)
    with pytest.raises(native_entropy.NativeBuildError, match="failed on entropy_rows.cpp: .*error"):
        native_entropy.build_library(tmp_path / "native")
    assert not any(p.suffix == ".so" for p in (tmp_path / "native").iterdir())


def test_the_kept_values_are_reused_grown_and_read_within_the_vocabulary(tmp_path: Path) -> None:
    import torch
    from entroloop.collectors.vllm.native_entropy import NativeShiftedEntropy

    entropy = NativeShiftedEntropy(keep_for_surprisal=True, folder=tmp_path / "native")
    gen = torch.Generator().manual_seed(3)
    entropy(torch.randn(5, 5000, generator=gen) * 20)
    kept = (entropy._z.data_ptr(), entropy._shift.data_ptr())
    assert entropy._z.shape == (8, 5000) and entropy._z.dtype == torch.float16
    assert entropy._shift.shape == (8, 3)  # chunks of 2,048
    for rows in (1, 8, 0):
        logits = torch.randn(rows, 5000, generator=gen) * 20
        assert torch.allclose(entropy(logits).double(), entropy_reference(logits), atol=1e-4)
        assert (entropy._z.data_ptr(), entropy._shift.data_ptr()) == kept  # no new [rows, vocab] memory
    logits = torch.randn(19, 5000, generator=gen) * 20
    assert torch.allclose(entropy(logits).double(), entropy_reference(logits), atol=1e-4)
    assert entropy._z.shape == (19, 5000)  # grown to the larger batch, then kept
    with pytest.raises(IndexError, match="outside the vocabulary"):
        entropy.surprisal([0], [5000])
    # a token in a wholly masked chunk reads floored (~87 nats above the row's log-sum), never inf
    masked = torch.randn(1, 5000, generator=gen)
    masked[0, 2048:4096] = float("-inf")
    entropy(masked)
    assert abs(entropy.surprisal([0], [3000]).item() - floored(masked)) < 0.02  # the floor in float16
    # a token far below the row's max but not below its own chunk's max: floored all the same
    far = torch.randn(1, 5000, generator=gen)
    far[0, 0] = 200.0  # chunk 0; token 3000 is in chunk 1, ~200 nats down
    entropy(far)
    assert abs(entropy.surprisal([0], [3000]).item() - floored(far)) < 0.02


def floored(row) -> float:
    """The surprisal a floored token reads (as in the other CPU forms): 87 nats below the row's max,
    i.e. 87 + ln(sum exp(x - max)) nats."""
    import torch

    return 87.0 + (torch.logsumexp(row.double(), -1) - row.double().max()).item()
