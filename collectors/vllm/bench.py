"""Generation throughput of one engine and workload: plain, with the entropy tap, with top-20 logprobs.

Each variant runs in its own Python process (``python -m collectors.vllm.bench VARIANT ...``) so
the engines never share state and the tap's switch (``ENTROLOOP_ENTROPY_TAP_ENABLED``) is read by
a fresh engine core. Timing covers ``LLM.generate`` after a warm-up batch, plus — for the common
practice — the host-side entropy from the returned top-20 logprobs, which is part of its cost.

The model is a random-weight Llama built locally (no downloads) with a realistic vocabulary size,
because the tap's cost scales with the vocabulary, not with the tiny model body. On a CPU the
figures are CPU figures; the ≥ 0.99× target is a GPU target.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

VARIANTS = ("plain", "tap", "top20")
LM_HEAD_GAIN = 15.0  # mean exact entropy of a few nats, as trained chat models show


@dataclass
class Workload:
    requests: int = 16
    prompt_tokens: int = 32
    max_tokens: int = 64
    max_num_seqs: int = 8
    vocab: int = 32000
    hidden: int = 256
    layers: int = 2
    seed: int = 0


def build_model(folder: Path, work: Workload) -> Path:
    """A random Llama with ``work.vocab`` logits per token (no tokenizer: prompts are token ids)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=work.vocab,
        hidden_size=work.hidden,
        intermediate_size=work.hidden * 2,
        num_hidden_layers=work.layers,
        num_attention_heads=work.hidden // 64,
        num_key_value_heads=work.hidden // 64,
        head_dim=64,
        max_position_embeddings=1024,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(work.seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        # Default initialisation gives almost uniform next-token distributions (entropy ~ log V);
        # a larger output head gives the peaked-but-varied distributions of a trained model.
        model.lm_head.weight.mul_(LM_HEAD_GAIN)
    model.save_pretrained(folder, safe_serialization=True)
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


def run_variant(variant: str, model: Path, work: Workload, sink_dir: Path) -> dict:
    """In this process: one engine, warm-up, then the timed workload. Returns figures."""
    os.environ["ENTROLOOP_ENTROPY_TAP_ENABLED"] = "true" if variant == "tap" else "false"
    os.environ["ENTROLOOP_ENTROPY_TAP_SINK"] = f"file:{sink_dir}/tokens-{{pid}}.bin"
    os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=str(model),
        skip_tokenizer_init=True,
        dtype="float32",
        enforce_eager=True,
        max_model_len=work.prompt_tokens + work.max_tokens + 8,
        max_num_seqs=work.max_num_seqs,
        seed=work.seed,
    )
    logprobs = 20 if variant == "top20" else None

    def params(i: int, max_tokens: int) -> SamplingParams:
        return SamplingParams(
            temperature=0.0,
            max_tokens=max_tokens,
            ignore_eos=True,
            detokenize=False,
            logprobs=logprobs,
            extra_args={"entroloop_request_id": f"bench-{i}"},
        )

    prompts = _prompts(work)
    llm.generate(prompts[: work.max_num_seqs], [params(-1 - i, 8) for i in range(work.max_num_seqs)], use_tqdm=False)
    start = time.perf_counter()
    outputs = llm.generate(prompts, [params(i, work.max_tokens) for i in range(work.requests)], use_tqdm=False)
    host_entropies: dict[str, list[float]] = {}
    if variant == "top20":
        for i, out in enumerate(outputs):
            host_entropies[f"bench-{i}"] = [topk_entropy(step) for step in out.outputs[0].logprobs]
    elapsed = time.perf_counter() - start
    tokens = sum(len(out.outputs[0].token_ids) for out in outputs)
    result = {"variant": variant, "tokens": tokens, "seconds": elapsed, "tokens_per_s": tokens / elapsed}
    if variant == "top20":
        result["host_entropies"] = host_entropies
        result["logprob_bytes_per_request"] = _logprob_payload_bytes(outputs)
    return result


def _logprob_payload_bytes(outputs) -> float:
    """Bytes of the top-20 logprobs a client receives per request (ids + floats, JSON-ish)."""
    total = 0
    for out in outputs:
        for step in out.outputs[0].logprobs:
            total += sum(len(str(tok)) + len(repr(lp.logprob)) + 4 for tok, lp in step.items())
    return total / max(1, len(outputs))


def run(work: Workload, python: str = sys.executable, model: Path | None = None) -> dict:
    """Run the three variants one after the other, each in a fresh process; return the comparison."""
    from collectors.vllm.emit import read_frames

    with tempfile.TemporaryDirectory(prefix="entroloop-bench-") as tmp:
        tmp_path = Path(tmp)
        model = model or build_model(tmp_path / "model", work)
        results = {}
        for variant in VARIANTS:
            sink_dir = tmp_path / f"sink-{variant}"
            sink_dir.mkdir()
            result_path = tmp_path / f"{variant}.json"
            proc = subprocess.run(
                [python, "-m", "collectors.vllm.bench", variant, str(model), str(sink_dir), json.dumps(asdict(work)),
                 str(result_path)],
                capture_output=True,
                text=True,
                check=False,
            )
            if proc.returncode != 0:
                raise RuntimeError(f"bench variant {variant} failed:\n{proc.stderr[-4000:]}")
            results[variant] = json.loads(result_path.read_text())
            if variant == "tap":
                records = [r for p in sorted(sink_dir.glob("tokens-*.bin")) for r in read_frames(p)]
                results[variant]["exact"] = {
                    r.request_id: r.values().astype(float).tolist()
                    for r in records
                    if r.request_id.startswith("bench-") and not r.request_id.startswith("bench--")
                }
                results[variant]["records"] = len(records)
    plain = results["plain"]["tokens_per_s"]
    exact = results["tap"].pop("exact")
    approx = results["top20"].pop("host_entropies")
    errors = [abs(a - e) for rid, values in exact.items() for a, e in zip(approx.get(rid, []), values)]
    all_exact = [v for values in exact.values() for v in values]
    return {
        "workload": asdict(work),
        "plain_tokens_per_s": plain,
        "tap_tokens_per_s": results["tap"]["tokens_per_s"],
        "top20_tokens_per_s": results["top20"]["tokens_per_s"],
        "tap_ratio": results["tap"]["tokens_per_s"] / plain,
        "top20_ratio": results["top20"]["tokens_per_s"] / plain,
        "tap_bytes_per_token": 2,
        "top20_logprob_bytes_per_request": results["top20"]["logprob_bytes_per_request"],
        "top20_entropy_abs_error_mean": sum(errors) / len(errors) if errors else None,
        "top20_entropy_abs_error_max": max(errors) if errors else None,
        "tap_requests_shipped": len(exact),
        "exact_entropy_mean": sum(all_exact) / len(all_exact) if all_exact else None,
    }


if __name__ == "__main__":
    # vLLM logs to stdout, so the figures go to a file named by the parent.
    variant_name, model_dir, sink, work_json, result_file = sys.argv[1:6]
    figures = run_variant(variant_name, Path(model_dir), Workload(**json.loads(work_json)), Path(sink))
    Path(result_file).write_text(json.dumps(figures))
