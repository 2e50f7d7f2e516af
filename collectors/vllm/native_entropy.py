"""The tap's CPU reduction as a hand-written C++ kernel (``entropy_rows.cpp``), built on the node.

Why by hand: Inductor compiles the same algorithm (``compiled_entropy``) into three loops over the
logits (max; sums; the float16 store) and accumulates its sums through a helper kept in memory, so
at vLLM's one torch thread it was compute-bound at ~1 ns per logit. The kernel here reads each
chunk of 2,048 logits from memory once and does the rest from L1: for [8, 151,936] float32 on one
thread (AMD EPYC, 2026-12-07, same process, interleaved) 366 µs against the compiled form's
1,193 µs with warm caches, 583 µs against 1,606 µs after 96 MB of other traffic, as between two
vLLM steps. It keeps what the one-step-late surprisals need: the float16 shifted logits, relative to
each chunk's max, and each chunk's shift to the row's max.

Building: the system's C++ compiler (``$CXX``, else ``c++``) with ``-O3 -march=native``, ~0.5 s, at
engine start (``warm_up``); the library is cached in a folder only this user can write (``$XDG_CACHE_HOME``
or ``~/.cache``, ``entroloop/native``), named by the hash of the source, the compiler and the CPU's
flags, and written by rename, so a half-written or foreign library is never loaded. Whatever fails
(no compiler, a foreign cache folder, a compile error) is logged once and the compiled form is used
instead (which falls back in turn to the torch-op form).

One thread: the kernel runs on the calling thread. With several torch threads ``entropy_function``
picks the compiled form, which splits rows across them.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch
from entroloop.collectors.vllm.compiled_entropy import (
    CompiledShiftedEntropy,
    unsafe_cache_reason,
)
from entroloop.collectors.vllm.fused_entropy import (
    LOG2_E,
    MASK_FLOOR,
    TemperatureEntropy,
    surprisals_from_shifts,
)

from entroloop.infra.private_files import make_private_dir

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("entropy_rows.cpp")
FLAGS = ("-O3", "-march=native", "-fno-math-errno", "-std=gnu++17", "-shared", "-fPIC")
Z_FLOOR = MASK_FLOOR * LOG2_E  # the kernel's FLOOR: a token read through its chunk's shift stays >= it


class NativeBuildError(RuntimeError):
    """The kernel could not be built or loaded here (the message says why and what to do)."""


def cache_folder() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "entroloop" / "native"


def _compiler() -> str:
    name = os.environ.get("CXX") or "c++"
    path = shutil.which(name)
    if path is None:
        raise NativeBuildError(f"no C++ compiler {name!r} on PATH (set CXX, or ENTROLOOP_ENTROPY_TAP_COMPILED=false)")
    return path


def _cpu_flags() -> str:
    """-march=native builds for this CPU: a cache shared with another machine must not reuse it."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line
    except OSError:
        pass
    return platform.processor()


def _library_key(compiler: str, source: bytes) -> str:
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, timeout=30, check=False).stdout
    digest = hashlib.sha256()
    for part in (source, version.encode(), " ".join(FLAGS).encode(), platform.machine().encode(),
                 _cpu_flags().encode()):
        digest.update(part)
        digest.update(b"\0")
    return digest.hexdigest()[:20]


def build_library(folder: Path | None = None) -> Path:
    """The kernel's shared library, built into ``folder`` (default ``cache_folder()``) unless a build
    of the same source, compiler and CPU is there already. Raises ``NativeBuildError``."""
    folder = Path(folder or cache_folder())
    compiler = _compiler()
    source = SOURCE.read_bytes()
    make_private_dir(folder)
    unsafe = unsafe_cache_reason(str(folder))
    if unsafe:
        raise NativeBuildError(f"not loading code from {unsafe}; set XDG_CACHE_HOME to a folder only this user "
                               "can write (or ENTROLOOP_ENTROPY_TAP_COMPILED=false)")
    library = folder / f"entropy_rows-{_library_key(compiler, source)}.so"
    if library.exists():
        unsafe = unsafe_cache_reason(str(library))
        if unsafe:
            raise NativeBuildError(f"not loading {library}: {unsafe}")
        return library
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        built = Path(scratch) / library.name
        result = subprocess.run([compiler, *FLAGS, "-o", str(built), str(SOURCE)],
                                capture_output=True, text=True, timeout=300, check=False)
        if result.returncode != 0:
            raise NativeBuildError(f"{compiler} failed on {SOURCE.name}: {result.stderr.strip()[-2000:]}")
        os.chmod(built, 0o500)
        os.replace(built, library)  # atomic: another engine on this node sees all of it or nothing
    return library


def load_library(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    pointer, size = ctypes.c_void_p, ctypes.c_int64
    lib.entropy_rows.argtypes = [pointer, size, size, size, pointer, pointer, pointer, pointer, pointer]
    lib.entropy_rows.restype = None
    lib.entropy_rows_chunk.argtypes = []
    lib.entropy_rows_chunk.restype = ctypes.c_int64
    return lib


def _check_host_matrix(logits: torch.Tensor) -> None:
    """The kernel reads host memory through a raw pointer: anything else must be refused, not read."""
    if logits.dim() != 2:
        raise ValueError(f"logits must be [rows, vocab], got shape {tuple(logits.shape)}")
    if logits.device.type != "cpu":
        raise ValueError(f"the native entropy kernel reads host memory; got logits on {logits.device}")


class NativeShiftedEntropy:
    """The tap's entropy reduction on a CPU with one torch thread: the C++ kernel, built on first use
    (or ``warm_up``), with what ``surprisal`` needs kept when ``keep_for_surprisal``.

    Same interface as ``CompiledShiftedEntropy``, to which it falls back for good (logged once) if
    the kernel cannot be built or loaded."""

    def __init__(self, keep_for_surprisal: bool = False, folder: Path | None = None) -> None:
        self.keep_for_surprisal = keep_for_surprisal
        self.folder = folder
        self.fallback: CompiledShiftedEntropy | None = None
        self._lib: ctypes.CDLL | None = None
        self._chunk = 0
        self._z: torch.Tensor | None = None  # float16 [rows, vocab], grown to the largest batch seen
        self._shift: torch.Tensor | None = None  # float32 [rows, chunks]
        self._z_host = self._shift_host = None  # numpy views: a handful of reads per step
        self._log2_sum = torch.empty(0)
        self._log2_sum_list: list[float] = []
        self._temperature_fallback: TemperatureEntropy | None = None

    def warm_up(self, vocab: int) -> None:
        """Build (or load) the kernel now rather than in the first serving step."""
        with torch.inference_mode():
            self(torch.zeros(1, vocab))
        if self.fallback is not None:
            self.fallback.warm_up(vocab)

    def _load(self) -> ctypes.CDLL | None:
        if self._lib is None and self.fallback is None:
            try:
                self._lib = load_library(build_library(self.folder))
                self._chunk = int(self._lib.entropy_rows_chunk())
            except (NativeBuildError, OSError, subprocess.SubprocessError) as error:
                log.error("entroloop entropy tap: the native CPU kernel is not available (%s); using the "
                          "torch.compile form", error)
                self.fallback = CompiledShiftedEntropy(keep_for_surprisal=self.keep_for_surprisal)
        return self._lib

    def __call__(self, logits: torch.Tensor) -> torch.Tensor:
        _check_host_matrix(logits)
        lib = self._load()
        if lib is None:
            return self.fallback(logits)  # type: ignore[misc]
        logits = logits.float()
        if logits.stride(1) != 1:
            logits = logits.contiguous()
        rows, vocab = logits.shape
        entropy = torch.empty(rows, dtype=torch.float32)
        if rows == 0:
            return entropy
        if self._log2_sum.shape[0] < rows:
            self._log2_sum = torch.empty(max(rows, 8), dtype=torch.float32)
        z = shift = None
        if self.keep_for_surprisal:
            z, shift = self._kept(rows, vocab)
        lib.entropy_rows(logits.data_ptr(), rows, vocab, logits.stride(0), entropy.data_ptr(),
                         self._log2_sum.data_ptr(), None if z is None else z.data_ptr(),
                         None if shift is None else shift.data_ptr(), None)
        if self.keep_for_surprisal:
            self._log2_sum_list = self._log2_sum[:rows].tolist()
        return entropy

    def at_temperatures(self, logits: torch.Tensor, rows: Sequence[int], temperatures: Sequence[float]) -> torch.Tensor:
        """The entropy of ``logits[rows[i]] / temperatures[i]`` (the tap's sampling pass), by the same
        kernel, keeping nothing: what the last call kept for ``surprisal`` stays as it was."""
        _check_host_matrix(logits)
        lib = self._load()
        if lib is None:
            if self._temperature_fallback is None:
                self._temperature_fallback = TemperatureEntropy(torch.device("cpu"))
            return self._temperature_fallback(logits, list(rows), list(temperatures))
        logits = logits.float()
        if logits.stride(1) != 1:
            logits = logits.contiguous()
        entropy = torch.empty(len(rows), dtype=torch.float32)
        if not rows:
            return entropy
        inverse = torch.tensor([1.0 / t for t in temperatures], dtype=torch.float32)
        log2_sum = torch.empty(1, dtype=torch.float32)
        row_bytes, item = logits.stride(0) * logits.element_size(), entropy.element_size()
        for i, row in enumerate(rows):  # row by row from the logits themselves: no gathered copy
            if not 0 <= row < logits.shape[0]:
                raise IndexError(f"row {row} is outside the batch (0..{logits.shape[0] - 1})")
            lib.entropy_rows(logits.data_ptr() + row * row_bytes, 1, logits.shape[1], logits.stride(0),
                             entropy.data_ptr() + i * item, log2_sum.data_ptr(), None, None,
                             inverse.data_ptr() + i * item)
        return entropy

    def _kept(self, rows: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
        chunks = -(-vocab // self._chunk)
        if self._z is None or self._z.shape[1] != vocab or self._z.shape[0] < rows:
            self._z = torch.empty(max(rows, 8), vocab, dtype=torch.float16)
            self._shift = torch.empty(max(rows, 8), chunks, dtype=torch.float32)
            self._z_host, self._shift_host = self._z.numpy(), self._shift.numpy()
        return self._z, self._shift  # type: ignore[return-value]

    def _z_at(self, row: int, token: int) -> float:
        z = float(self._z_host[row, token]) + float(self._shift_host[row, token // self._chunk])  # type: ignore[index]
        return max(z, Z_FLOOR)

    def surprisal(self, rows: Sequence[int], tokens: Sequence[int]) -> torch.Tensor:
        """``-log p(tokens[i])`` in nats under row ``rows[i]``'s softmax at the last call (float32);
        only with ``keep_for_surprisal``. Tokens floored at ``MASK_FLOOR`` read as at most ~87 nats."""
        if self.fallback is not None:
            return self.fallback.surprisal(rows, tokens)
        if not self.keep_for_surprisal or self._z_host is None:
            raise RuntimeError("surprisal needs keep_for_surprisal=True and a call before it")
        return surprisals_from_shifts(rows, tokens, self._z_host.shape[1], self._z_at, self._log2_sum_list)
