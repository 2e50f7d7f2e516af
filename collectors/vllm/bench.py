"""Generation throughput of one engine and workload: plain, with the entropy tap, with top-20 logprobs.

A round runs one engine, in its own Python process (``python -m entroloop.collectors.vllm.bench
MODEL ...``), with the tap loaded and on; the variants are per-request sampling parameters
(``serve``): the plain passes opt their requests out of the tap (``entroloop_tap: false``), the
top-20 ones also ask for logprobs. Timing covers ``LLM.generate`` after a warm-up, plus — for the
common practice — the host-side entropy from the returned top-20 logprobs, which is part of its cost.

The variants take turns, one timed pass each (the order reversed every other turn), so a plain pass
and a tap pass are seconds apart and the ratio is the median of those adjacent pairs. Why one
engine for all: with an engine process per variant (until 2026-12-07) the rounds disagreed by more
than the tap costs (0.93–0.99 around a tap of ~2 % of a step) while the turns within a round
agreed: each process has its own placement in memory and caches, a bias fixed for the process's
life that no pairing of turns cancels. Before that, one engine process after the other, a minute
apart, the machine's drift between them was larger still (per-round ratios 0.78–1.21).

The models have random weights and are built locally (no downloads), in two shapes (``SHAPES``): a
tiny Llama (2 layers, hidden 256, vocabulary 32,000), where the step is so cheap that the tap's
fixed per-step cost shows, and Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14/2 heads,
intermediate 4864, vocabulary 151,936, bfloat16), where the step costs what a small real model's
does; both cached under ~/.cache/entroloop/bench-models by a content key. On a CPU the figures are
CPU figures; the ≥ 0.99× target is a GPU target.

``run_round`` runs every variant's passes and ``round_figures`` turns them into ratios and the
tap's per-step overhead; ``entroloop.benchmarks.collector`` repeats rounds and times the entropy
reduction alone (on CUDA including the fused Triton kernel).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TextIO

VARIANTS = ("plain", "tap", "top20")
PASSES = 10  # timed passes per variant; the variants take turns, pass by pass (pairs spread ±3 %)
LM_HEAD_GAIN = 15.0  # mean exact entropy of a few nats, as trained chat models show
MODEL_CACHE = Path.home() / ".cache" / "entroloop" / "bench-models"
BUILDER_VERSION = 2  # bump when build_model changes what it writes (the cache key includes it)


@dataclass
class Workload:
    """One engine configuration and batch. ``shape`` names the model's shape (see ``SHAPES``)."""

    shape: str = "tiny"
    architecture: str = "llama"  # "llama" or "qwen2" (the transformers / vLLM model class)
    requests: int = 16
    prompt_tokens: int = 32
    max_tokens: int = 64
    max_num_seqs: int = 8
    vocab: int = 32000
    hidden: int = 256
    layers: int = 2
    heads: int = 4
    kv_heads: int = 4
    intermediate: int = 512
    dtype: str = "float32"  # of the weights and the engine ("bfloat16" needs AVX-512 BF16 / AMX on a CPU)
    seed: int = 0
    variants: tuple[str, ...] = VARIANTS

    def __post_init__(self) -> None:
        self.variants = tuple(self.variants)  # a list after a JSON round trip
        unknown = set(self.variants) - set(VARIANTS)
        if unknown or "plain" not in self.variants:
            raise ValueError(f"variants must include 'plain' and be among {VARIANTS}, got {self.variants}")
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError(f"hidden {self.hidden} must divide into {self.heads} heads, "
                             f"and those into {self.kv_heads} KV heads")

    @property
    def steps(self) -> int:
        """Engine steps of the timed batch: every request runs to ``max_tokens`` (EOS ignored), so
        each wave of ``max_num_seqs`` requests takes ``max_tokens`` steps (the first one the prefill)."""
        return math.ceil(self.requests / self.max_num_seqs) * self.max_tokens

    def describe(self) -> str:
        return (f"{self.shape}: random {self.architecture}, hidden {self.hidden}, {self.layers} layers, "
                f"{self.heads}/{self.kv_heads} heads, intermediate {self.intermediate}, vocab {self.vocab:,}, "
                f"{self.dtype}; {self.requests} requests x {self.max_tokens} tokens, batch {self.max_num_seqs}")


# The tiny shape makes the step cheap, so it shows the tap's fixed per-step bookkeeping; the
# realistic one has Qwen2.5-0.5B's shape (weights random, built here), so the step costs what a
# small real model's does and the tap's share of it is what a serving node would see.
SHAPES: dict[str, Workload] = {
    "tiny": Workload(),
    "qwen2.5-0.5b": Workload(
        shape="qwen2.5-0.5b", architecture="qwen2", requests=8, prompt_tokens=32, max_tokens=32, max_num_seqs=8,
        vocab=151_936, hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, dtype="bfloat16",
        variants=("plain", "tap"),
    ),
}

_MODEL_FIELDS = ("architecture", "vocab", "hidden", "layers", "heads", "kv_heads", "intermediate", "dtype", "seed")


def model_key(work: Workload) -> str:
    """Content key of the model ``build_model`` writes for ``work`` (its shape, dtype, seed, gain)."""
    spec = {name: getattr(work, name) for name in _MODEL_FIELDS}
    spec |= {"gain": LM_HEAD_GAIN, "builder": BUILDER_VERSION}
    return hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:12]


def cached_model(work: Workload, cache: Path = MODEL_CACHE) -> Path:
    """The model for ``work`` under ``cache``, built once (a realistic shape takes a minute or two)."""
    folder = cache / f"{work.shape}-{model_key(work)}"
    if (folder / "config.json").exists():
        return folder
    cache.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=cache))
    try:
        build_model(partial, work)
        partial.rename(folder)  # atomic: a half-written model is never found
    except OSError:
        shutil.rmtree(partial, ignore_errors=True)
        if not (folder / "config.json").exists():  # not a concurrent builder that won the race
            raise
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return folder


def build_model(folder: Path, work: Workload) -> Path:
    """A random model with ``work``'s shape and ``work.vocab`` logits per token (no tokenizer: prompts
    are token ids). Untied output head, so its gain can be set on its own."""
    import torch
    from transformers import (
        LlamaConfig,
        LlamaForCausalLM,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    config_class, model_class = {
        "llama": (LlamaConfig, LlamaForCausalLM), "qwen2": (Qwen2Config, Qwen2ForCausalLM)
    }[work.architecture]
    config = config_class(
        vocab_size=work.vocab,
        hidden_size=work.hidden,
        intermediate_size=work.intermediate,
        num_hidden_layers=work.layers,
        num_attention_heads=work.heads,
        num_key_value_heads=work.kv_heads,
        head_dim=work.hidden // work.heads,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        torch_dtype=work.dtype,
    )
    torch.manual_seed(work.seed)
    model = model_class(config)
    with torch.no_grad():
        # Default initialisation gives almost uniform next-token distributions (entropy ~ log V);
        # a larger output head gives the peaked-but-varied distributions of a trained model.
        model.lm_head.weight.mul_(LM_HEAD_GAIN)
    model.to(getattr(torch, work.dtype)).save_pretrained(folder, safe_serialization=True)
    return folder


def _prompts(work: Workload) -> list[dict]:
    import random

    rng = random.Random(work.seed)
    return [
        {"prompt_token_ids": [rng.randrange(3, work.vocab) for _ in range(work.prompt_tokens)]}
        for _ in range(work.requests)
    ]


def topk_entropy(logprobs: dict) -> float:
    """Entropy from the top-k logprobs only, renormalised: what host-side practice computes."""
    lps = [lp.logprob for lp in logprobs.values() if math.isfinite(lp.logprob)]
    mass = sum(math.exp(v) for v in lps)
    return -sum(math.exp(v) / mass * (v - math.log(mass)) for v in lps)


def serve(model: Path, work: Workload, sink_dir: Path, commands: TextIO, replies: TextIO) -> None:
    """In this process: one engine and its warm-up, then one timed pass of the workload per ``pass
    VARIANT`` line read from ``commands``, each answered by a JSON line on ``replies`` (``{"ready":
    true}`` once warm). The tap is loaded and on; a variant is a pass's sampling parameters: ``tap``
    leaves the requests measured, ``plain`` opts them out (``entroloop_tap: false``: the processor is
    called each step and finds no measured row), ``top20`` opts out and asks for 20 logprobs. A pass's
    time covers ``LLM.generate`` (and, for top-20, the host entropy); a variant's first pass also
    returns what the round compares (host entropies, logprob payload)."""
    os.environ["ENTROLOOP_ENTROPY_TAP_ENABLED"] = "true"
    os.environ["ENTROLOOP_ENTROPY_TAP_SINK"] = f"file:{sink_dir}/tokens-{{pid}}.bin"
    os.environ["ENTROLOOP_ENTROPY_TAP_TIMINGS"] = f"{sink_dir}/tap-seconds-{{pid}}.bin"
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=str(model),
        skip_tokenizer_init=True,
        dtype=work.dtype,
        enforce_eager=True,
        max_model_len=work.prompt_tokens + work.max_tokens + 8,
        max_num_seqs=work.max_num_seqs,
        seed=work.seed,
    )

    def params(variant: str, request_id: str, max_tokens: int) -> SamplingParams:
        return SamplingParams(
            temperature=0.0,
            max_tokens=max_tokens,
            ignore_eos=True,
            detokenize=False,
            logprobs=20 if variant == "top20" else None,
            extra_args={"entroloop_request_id": request_id, "entroloop_tap": variant == "tap"},
        )

    def reply(message: dict) -> None:
        replies.write(json.dumps(message) + "\n")
        replies.flush()

    tap_seconds = _TapSeconds(sink_dir)
    prompts = _prompts(work)
    for variant in work.variants:  # warm every path a pass takes (the tap's buffers, the logprobs)
        llm.generate(prompts[: work.max_num_seqs],
                     [params(variant, f"warm-{variant}-{i}", 8) for i in range(work.max_num_seqs)], use_tqdm=False)
    tap_seconds.read()  # the warm-up's
    reply({"ready": True})
    passes = dict.fromkeys(work.variants, 0)
    for command in commands:
        verb, _, variant = command.strip().partition(" ")
        if verb != "pass" or variant not in passes:
            break
        # A variant's first pass has ids bench-0..; later ones are unique (bench--...), so only the
        # first pass's records are compared with the top-20 practice.
        n, passes[variant] = passes[variant], passes[variant] + 1
        ids = [f"bench-{i}" if n == 0 else f"bench--{variant}-{n}-{i}" for i in range(work.requests)]
        start = time.perf_counter()
        outputs = llm.generate(prompts, [params(variant, rid, work.max_tokens) for rid in ids], use_tqdm=False)
        host_entropies: dict[str, list[float]] = {}
        if variant == "top20":
            for rid, out in zip(ids, outputs):
                host_entropies[rid] = [topk_entropy(step) for step in out.outputs[0].logprobs]
        answer: dict = {"seconds": time.perf_counter() - start,
                        "tokens": sum(len(out.outputs[0].token_ids) for out in outputs),
                        "tap_seconds": tap_seconds.read()}
        if n == 0 and variant == "top20":
            answer |= {"host_entropies": host_entropies, "logprob_bytes_per_request": _logprob_payload_bytes(outputs)}
        reply(answer)


class _TapSeconds:
    """The tap's own time inside the engine (``entropy_tap_timings`` files in ``folder``), read pass
    by pass: each ``read`` sums what was appended since the last. The requests a pass finishes leave
    the batch at the next pass's first step, so their shipping counts there (a few µs per request)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.offsets: dict[Path, int] = {}

    def read(self) -> float:
        total = 0.0
        for path in sorted(self.folder.glob("tap-seconds-*.bin")):
            start = self.offsets.get(path, 0)
            with path.open("rb") as timings:
                timings.seek(start)  # only what was appended since the last read
                data = timings.read()
            whole = len(data) // 8 * 8  # a write in progress is read next time
            total += sum(value for (value,) in struct.iter_unpack("<d", data[:whole]))
            self.offsets[path] = start + whole
        return total


def _logprob_payload_bytes(outputs) -> float:
    """Bytes of the top-20 logprobs a client receives per request (ids + floats, JSON-ish)."""
    total = 0
    for out in outputs:
        for step in out.outputs[0].logprobs:
            total += sum(len(str(tok)) + len(repr(lp.logprob)) + 4 for tok, lp in step.items())
    return total / max(1, len(outputs))


class _EngineProcess:
    """The round's engine in its own process (``serve``), driven pass by pass."""

    def __init__(self, work: Workload, model: Path, run_dir: Path, python: str) -> None:
        self.run_dir = run_dir
        self.sink_dir = run_dir / "sink"
        self.sink_dir.mkdir()
        self.log_path = run_dir / "engine.log"
        read_end, write_end = os.pipe()  # replies: vLLM logs to stdout, so not there
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [python, "-m", "entroloop.collectors.vllm.bench", str(model), str(self.sink_dir),
                 json.dumps(asdict(work)), str(write_end)],
                stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT, pass_fds=(write_end,), text=True,
            )
        os.close(write_end)  # ours: the child's exit must end our reads
        self.replies = os.fdopen(read_end, "r")
        self.passes: dict[str, list[dict]] = {variant: [] for variant in work.variants}
        try:
            self._read()  # {"ready": true}: the engine is built and warm
        except BaseException:
            self.stop()
            raise

    def _read(self) -> dict:
        line = self.replies.readline()
        if not line:
            self.proc.wait(60)
            tail = self.log_path.read_text(errors="replace")[-4000:]
            raise RuntimeError(f"bench engine failed (exit {self.proc.returncode}):\n{tail}")
        return json.loads(line)

    def timed_pass(self, variant: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(f"pass {variant}\n")
        self.proc.stdin.flush()
        self.passes[variant].append(self._read())

    def stop(self) -> None:
        if self.proc.stdin is not None and not self.proc.stdin.closed:
            try:
                self.proc.stdin.close()  # end of commands: the engine process exits
            except BrokenPipeError:
                pass
        try:
            self.proc.wait(120)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
        self.replies.close()

    def result(self, variant: str, steps: int) -> dict:
        passes = self.passes[variant]
        seconds = [p["seconds"] for p in passes]
        tokens = passes[0]["tokens"]
        fastest = min(seconds)
        result = {"variant": variant, "tokens": tokens, "seconds": fastest, "passes": seconds,
                  "tap_seconds": [p.get("tap_seconds") for p in passes],
                  "tokens_per_s": tokens / fastest, "step_us": fastest / steps * 1e6}
        for key in ("host_entropies", "logprob_bytes_per_request"):
            if key in passes[0]:
                result[key] = passes[0][key]
        return result


def run_round(work: Workload, model: Path, scratch: Path, python: str = sys.executable,
              order: tuple[str, ...] | None = None) -> dict:
    """One round: one engine process, warmed, then ``PASSES`` turns in which each variant of
    ``work.variants`` runs one timed pass (the order reversed every other turn); their figures, each
    pass's time included."""
    from entroloop.collectors.vllm.emit import read_frames

    order = tuple(order or work.variants)
    engine = _EngineProcess(work, model, Path(tempfile.mkdtemp(prefix="engine-", dir=scratch)), python)
    try:
        for turn in range(PASSES):
            for variant in (order if turn % 2 == 0 else tuple(reversed(order))):
                engine.timed_pass(variant)
    finally:
        engine.stop()
    results = {variant: engine.result(variant, work.steps) for variant in order}
    if "tap" in results:
        records = [r for p in sorted(engine.sink_dir.glob("tokens-*.bin")) for r in read_frames(p)]
        results["tap"]["exact"] = {
            r.request_id: r.values().astype(float).tolist()
            for r in records
            if r.request_id.startswith("bench-") and not r.request_id.startswith("bench--")
        }
        results["tap"]["records"] = len(records)
    shutil.rmtree(engine.run_dir, ignore_errors=True)
    return results


def paired(plain: dict, other: dict, steps: int) -> tuple[float, float]:
    """(other's tokens/s over plain's, other's extra µs per step): medians over the turns, each turn
    comparing two passes run seconds apart."""
    pairs = list(zip(plain["passes"], other["passes"], strict=True))
    ratio = statistics.median((other["tokens"] / o) / (plain["tokens"] / p) for p, o in pairs)
    overhead = statistics.median((o - p) / steps * 1e6 for p, o in pairs)
    return ratio, overhead


def in_engine(plain: dict, tap: dict, steps: int) -> tuple[float, float] | None:
    """(the tap's own time per step in µs, the tokens/s ratio if that were all it added): medians over
    the turns of the tap's time inside the engine in its pass minus in the plain pass (``tap_seconds``,
    timed by the tap itself), against the plain pass's time. Unlike ``paired`` this leaves out the
    forward pass, whose time wanders ±5 % from pass to pass and hides a cost of ~2 % of a step; it
    also leaves out whatever the tap might cost outside its own calls (``paired`` bounds that)."""
    timed_plain, timed_tap = plain.get("tap_seconds") or [], tap.get("tap_seconds") or []
    if not timed_plain or None in timed_plain or None in timed_tap:
        return None  # an engine whose tap was not timed
    pairs = list(zip(plain["passes"], timed_plain, timed_tap, strict=True))
    overhead = statistics.median((b - a) / steps * 1e6 for _, a, b in pairs)
    ratio = statistics.median(p / (p + b - a) for p, a, b in pairs)
    return overhead, ratio


def round_figures(work: Workload, results: dict) -> tuple[dict[str, float], dict]:
    """(numbers to repeat, details of this round) from one round's results."""
    plain = results["plain"]
    numbers = {"plain_tokens_per_s": plain["tokens_per_s"], "plain_step_us": plain["step_us"]}
    details: dict = {}
    if "tap" in results:
        tap = results["tap"]
        tap_ratio, tap_overhead = paired(plain, tap, work.steps)
        numbers |= {
            "tap_tokens_per_s": tap["tokens_per_s"],
            "tap_ratio": tap_ratio,
            "tap_overhead_us_per_step": tap_overhead,
        }
        timed = in_engine(plain, tap, work.steps)
        if timed is not None:
            numbers |= {"tap_in_engine_us_per_step": timed[0], "tap_in_engine_ratio": timed[1]}
        details["tap_requests_shipped"] = len(tap["exact"])
        all_exact = [v for values in tap["exact"].values() for v in values]
        details["exact_entropy_mean"] = sum(all_exact) / len(all_exact) if all_exact else None
    if "top20" in results:
        top20 = results["top20"]
        numbers |= {"top20_tokens_per_s": top20["tokens_per_s"],
                    "top20_ratio": paired(plain, top20, work.steps)[0]}
        details["top20_logprob_bytes_per_request"] = top20["logprob_bytes_per_request"]
        if "tap" in results:
            exact, approx = results["tap"]["exact"], top20["host_entropies"]
            errors = [abs(a - e) for rid, values in exact.items() for a, e in zip(approx.get(rid, []), values)]
            details["top20_entropy_abs_error_mean"] = sum(errors) / len(errors) if errors else None
            details["top20_entropy_abs_error_max"] = max(errors) if errors else None
    return numbers, details


if __name__ == "__main__":
    # vLLM logs to stdout, so the replies go to a pipe the parent passed (its descriptor number).
    model_dir, sink, work_json, reply_fd = sys.argv[1:5]
    with os.fdopen(int(reply_fd), "w") as reply_pipe:
        serve(Path(model_dir), Workload(**json.loads(work_json)), Path(sink), sys.stdin, reply_pipe)
