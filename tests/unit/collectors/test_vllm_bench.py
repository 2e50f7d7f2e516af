"""`entroloop bench collector` without an engine: the top-k baseline's entropy, the workloads, the
model cache, one round's figures and the report."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, replace
from pathlib import Path
from types import SimpleNamespace

import pytest
from entroloop.collectors.vllm import bench
from entroloop.collectors.vllm.bench import topk_entropy


def logprobs(probs: list[float]) -> dict[int, SimpleNamespace]:
    return {i: SimpleNamespace(logprob=math.log(p)) for i, p in enumerate(probs)}


def test_topk_entropy_is_exact_when_k_covers_the_distribution() -> None:
    probs = [0.5, 0.25, 0.25]
    assert math.isclose(topk_entropy(logprobs(probs)), -sum(p * math.log(p) for p in probs))


def test_topk_entropy_underestimates_flat_distributions() -> None:
    """20 of 1000 equally likely tokens: truly log(1000) nats, top-20 says log(20)."""
    flat = logprobs([1 / 1000] * 20)
    assert math.isclose(topk_entropy(flat), math.log(20))
    assert math.log(1000) - topk_entropy(flat) > 3.9


# --- the workloads, the model cache and one round's figures (no engine) -----------------------


def test_the_realistic_shape_is_qwen2_5_0_5b() -> None:
    work = bench.SHAPES["qwen2.5-0.5b"]
    assert (work.hidden, work.layers, work.heads, work.kv_heads, work.intermediate, work.vocab) == (
        896, 24, 14, 2, 4864, 151_936)
    assert work.variants == ("plain", "tap")


def test_a_workload_survives_the_json_hop_to_the_variant_process() -> None:
    work = bench.SHAPES["qwen2.5-0.5b"]
    assert bench.Workload(**json.loads(json.dumps(asdict(work)))) == work
    assert work.steps == 32 and replace(work, requests=9).steps == 64  # a second wave of requests


@pytest.mark.parametrize("bad", [{"variants": ("tap",)}, {"variants": ("plain", "beam")}, {"heads": 3},
                                 {"kv_heads": 3}])
def test_an_impossible_workload_is_refused(bad: dict) -> None:
    with pytest.raises(ValueError):
        replace(bench.SHAPES["tiny"], **bad)


def test_the_model_cache_key_follows_the_weights_not_the_batch() -> None:
    tiny = bench.SHAPES["tiny"]
    assert bench.model_key(tiny) == bench.model_key(replace(tiny, requests=99, max_tokens=3))
    assert bench.model_key(tiny) != bench.model_key(replace(tiny, vocab=32001))
    assert bench.model_key(tiny) != bench.model_key(replace(tiny, dtype="bfloat16"))


def test_a_model_is_built_once_and_never_found_half_written(tmp_path: Path, monkeypatch) -> None:
    built: list[Path] = []

    def fake_build(folder: Path, work) -> Path:
        built.append(folder)
        (folder / "config.json").write_text("{}")
        return folder

    monkeypatch.setattr(bench, "build_model", fake_build)
    first = bench.cached_model(bench.SHAPES["tiny"], cache=tmp_path)
    assert bench.cached_model(bench.SHAPES["tiny"], cache=tmp_path) == first and len(built) == 1
    assert first.name.startswith("tiny-") and (first / "config.json").exists()

    def failing_build(folder: Path, work) -> Path:
        (folder / "model.safetensors").write_text("half")
        raise RuntimeError("disk full")

    monkeypatch.setattr(bench, "build_model", failing_build)
    with pytest.raises(RuntimeError):
        bench.cached_model(replace(bench.SHAPES["tiny"], seed=1), cache=tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == [first.name]  # nothing half-written left


def test_one_round_gives_ratios_and_the_per_step_overhead() -> None:
    work = replace(bench.SHAPES["tiny"], requests=8, max_tokens=10)  # 10 steps
    results = {  # two turns; tokens/s from the fastest pass, ratios per turn
        "plain": {"tokens": 80, "passes": [0.8, 0.9], "tokens_per_s": 100.0, "step_us": 80_000.0},
        "tap": {"tokens": 80, "passes": [0.8 / 0.98, 0.9 / 0.98], "tokens_per_s": 98.0, "step_us": 81_632.0,
                "exact": {"bench-0": [1.0, 3.0], "bench-1": [2.0]}},
        "top20": {"tokens": 80, "passes": [0.8 / 0.6, 0.9 / 0.6], "tokens_per_s": 60.0,
                  "logprob_bytes_per_request": 5000.0, "host_entropies": {"bench-0": [0.5, 2.0], "bench-1": [2.0]}},
    }
    numbers, details = bench.round_figures(work, results)
    assert numbers["tap_ratio"] == pytest.approx(0.98) and numbers["top20_ratio"] == pytest.approx(0.6)
    # (0.8 / 0.98 - 0.8) and (0.9 / 0.98 - 0.9) s over 10 steps: their median
    assert numbers["tap_overhead_us_per_step"] == pytest.approx(0.85 * (1 / 0.98 - 1) / 10 * 1e6)
    assert details["top20_entropy_abs_error_mean"] == pytest.approx(0.5)  # (0.5 + 1.0 + 0.0) / 3
    assert details["top20_entropy_abs_error_max"] == pytest.approx(1.0)
    assert details["exact_entropy_mean"] == pytest.approx(2.0) and details["tap_requests_shipped"] == 2
    plain_and_tap, _ = bench.round_figures(work, {k: results[k] for k in ("plain", "tap")})
    assert "top20_ratio" not in plain_and_tap
    assert "tap_in_engine_ratio" not in numbers  # these passes carry no timings of the tap


def test_the_report_judges_the_realistic_shape_against_its_cpu_target(tmp_path: Path) -> None:
    from entroloop.benchmarks.repeats import Repeated
    from entroloop.cli.bench_collector import _write_report

    def rep(*values: float) -> Repeated:
        return Repeated(values, (0.5, 0.7))

    def result(shape: str, ratios: tuple[float, ...]) -> dict:
        work = bench.SHAPES[shape]
        repeated = {"plain_tokens_per_s": rep(50, 51, 52), "plain_step_us": rep(1e5, 1e5, 1e5),
                    "tap_tokens_per_s": rep(49, 50, 51), "tap_ratio": rep(*ratios),
                    "tap_overhead_us_per_step": rep(900, 1000, 1100),
                    "tap_in_engine_us_per_step": rep(1200, 1250, 1300), "tap_in_engine_ratio": rep(0.981, 0.982, 0.983)}
        return {"workload": asdict(work), "steps": work.steps, "repeated": repeated, "details": {},
                "reduction": {"cpu:fused_native": rep(500, 510, 520), "cpu:fused_torch_compiled": rep(600, 610, 620),
                              "cpu:fused_torch_one_chunk_buffered": rep(700, 710, 720),
                              "cpu:fused_torch_one_chunk": rep(800, 810, 820), "cpu:reference": rep(900, 910, 920)}}

    out = tmp_path / "BENCHMARKS.md"
    _write_report({"tiny": result("tiny", (0.7, 0.8, 0.9)), "qwen2.5-0.5b": result("qwen2.5-0.5b", (0.97, 0.99, 0.995))},
                  out)
    rows = {f["name"]: f for f in json.loads(out.with_suffix(".json").read_text())["collector"]}
    realistic = rows["qwen2.5-0.5b: entropy tap / plain"]
    assert realistic["value"] == 0.99 and realistic["met"] is True and realistic["runs"] == 3
    assert realistic["spread"] == "0.97–0.995" and realistic["load_average"] == 0.7
    assert rows["tiny: entropy tap / plain"]["met"] is None  # a CPU figure against a GPU target: not judged
    assert rows["qwen2.5-0.5b: entropy tap overhead per engine step"]["value"] == 1000
    assert rows["qwen2.5-0.5b: the tap's own time per engine step, timed inside the engine"]["value"] == 1250
    own = rows["qwen2.5-0.5b: entropy tap / plain, from the tap's own time"]
    assert own["value"] == 0.982 and own["met"] is None  # shown, not judged: it leaves costs out
    assert "the tap's choice" in rows["qwen2.5-0.5b: entropy reduction alone, fused_native on CPU"]["note"]
    assert "one torch thread" in rows["qwen2.5-0.5b: entropy reduction alone, fused_native on CPU"]["note"]
    for form in ("fused_torch_compiled", "fused_torch_one_chunk", "fused_torch_one_chunk_buffered"):
        assert "the tap's choice" not in rows[f"qwen2.5-0.5b: entropy reduction alone, {form} on CPU"]["note"]
    assert rows["fused Triton entropy kernel on a GPU"]["value"] is None  # said, not hidden
    _write_report({"qwen2.5-0.5b": result("qwen2.5-0.5b", (0.95, 0.96, 0.99))}, out)
    rows = {f["name"]: f for f in json.loads(out.with_suffix(".json").read_text())["collector"]}
    assert rows["qwen2.5-0.5b: entropy tap / plain"]["met"] is False


def test_a_ratio_whose_rounds_disagree_more_than_the_tap_costs_says_so() -> None:
    from entroloop.benchmarks.repeats import Repeated
    from entroloop.cli.bench_collector import _noise_note

    assert "re-measure on a quiet machine" in _noise_note(Repeated((0.999, 1.018, 1.135), (10.9,)))
    assert _noise_note(Repeated((0.95, 0.952, 0.955), (0.5,))) == ""  # 5 % cost, 0.5 % spread


def test_paired_turns_cancel_a_drift_that_fastest_passes_would_not() -> None:
    """The machine slows down halfway through the round, for both engines alike: the tap costs 2 %
    in every turn, and the paired ratio says so; the fastest passes (plain's from the quiet half,
    the tap's from the busy one) would say 20 %."""
    steps = 100
    plain = {"tokens": 1000, "passes": [1.0, 1.5, 1.5, 1.5], "tokens_per_s": 1000 / 1.0, "step_us": 1e4}
    tap = {"tokens": 1000, "passes": [1.25 * 1.02, 1.5 * 1.02, 1.5 * 1.02, 1.5 * 1.02],
           "tokens_per_s": 1000 / 1.275, "step_us": 1.275e4}
    ratio, overhead = bench.paired(plain, tap, steps)
    assert ratio == pytest.approx(1 / 1.02)
    assert overhead == pytest.approx(0.03 / steps * 1e6)  # 30 ms per pass over 100 steps: 300 µs
    assert tap["tokens_per_s"] / plain["tokens_per_s"] == pytest.approx(0.784, abs=1e-3)  # what it replaces


FAKE_ENGINE = '''#!{python}
"""Stands in for `python -m entroloop.collectors.vllm.bench MODEL SINK WORK REPLY_FD`."""
import json, os, sys, time
reply_fd = int(sys.argv[6])
if "{broken}":
    print("engine failed to start: out of memory", flush=True)
    sys.exit(3)
replies = os.fdopen(reply_fd, "w")
replies.write(json.dumps({{"ready": True}}) + "\\n"); replies.flush()
for line in sys.stdin:
    variant = line.split()[1]
    with open("{turns}", "a") as turns:
        turns.write(variant + "\\n")
    tap_seconds = 0.001 if variant == "plain" else 0.009  # the tap's own time in the pass
    replies.write(json.dumps({{"seconds": 0.5 if variant == "plain" else 0.51, "tokens": 80,
                              "tap_seconds": tap_seconds}}) + "\\n")
    replies.flush()
'''


def _fake_engine(tmp_path: Path, broken: str = "") -> tuple[str, Path]:
    import sys

    turns = tmp_path / "turns.txt"
    script = tmp_path / "fake-python"
    script.write_text(FAKE_ENGINE.format(python=sys.executable, broken=broken, turns=turns))
    script.chmod(0o755)
    return str(script), turns


def test_a_round_starts_one_engine_then_its_variants_take_turns_pass_by_pass(tmp_path: Path, monkeypatch) -> None:
    python, turns = _fake_engine(tmp_path)
    monkeypatch.setattr("entroloop.collectors.vllm.emit.read_frames", lambda path: [])
    work = replace(bench.SHAPES["qwen2.5-0.5b"], requests=8, max_tokens=10)
    results = bench.run_round(work, tmp_path / "model", tmp_path, python=python)
    assert turns.read_text().split() == ["plain", "tap", "tap", "plain"] * (bench.PASSES // 2)
    assert results["plain"]["passes"] == [0.5] * bench.PASSES and results["tap"]["passes"] == [0.51] * bench.PASSES
    numbers, _ = bench.round_figures(work, results)
    assert numbers["tap_ratio"] == pytest.approx(0.5 / 0.51)
    assert numbers["tap_overhead_us_per_step"] == pytest.approx(0.01 / work.steps * 1e6)
    # the tap's own time: 8 ms more in a tap pass than in a plain one
    assert numbers["tap_in_engine_us_per_step"] == pytest.approx(0.008 / work.steps * 1e6)
    assert numbers["tap_in_engine_ratio"] == pytest.approx(0.5 / 0.508)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith("engine-")]  # the run folder removed


def test_an_engine_that_dies_fails_the_round_with_its_log(tmp_path: Path) -> None:
    python, turns = _fake_engine(tmp_path, broken="yes")
    work = replace(bench.SHAPES["qwen2.5-0.5b"], requests=8, max_tokens=10)
    with pytest.raises(RuntimeError, match="bench engine failed .exit 3.:\n.*out of memory"):
        bench.run_round(work, tmp_path / "model", tmp_path, python=python)
    assert not turns.exists()  # no pass ran


def test_the_in_engine_figures_leave_out_the_forward_passs_wander() -> None:
    """Plain passes of 1.0 and 1.5 s (the machine wandered), the tap's own time 20 ms more in each tap
    pass than in its turn's plain pass: the in-engine ratio sees only the 20 ms."""
    plain = {"passes": [1.0, 1.5, 1.0], "tap_seconds": [0.001, 0.001, 0.002]}
    tap = {"passes": [1.6, 1.0, 1.2], "tap_seconds": [0.021, 0.021, 0.022]}
    overhead, ratio = bench.in_engine(plain, tap, steps=100)
    assert overhead == pytest.approx(200.0)  # 20 ms over 100 steps
    assert ratio == pytest.approx(1.0 / 1.02)
    assert bench.in_engine({**plain, "tap_seconds": [None] * 3}, tap, steps=100) is None  # an untimed engine


def test_the_tap_seconds_are_read_pass_by_pass_and_a_write_in_progress_waits(tmp_path: Path) -> None:
    """What the tap appended since the last read, per engine process file; a half-written value is
    left for the next read, never misread."""
    import struct

    reader = bench._TapSeconds(tmp_path)
    first, second = tmp_path / "tap-seconds-1.bin", tmp_path / "tap-seconds-2.bin"
    first.write_bytes(struct.pack("<2d", 0.25, 0.5))
    second.write_bytes(struct.pack("<d", 1.0) + struct.pack("<d", 2.0)[:3])
    assert reader.read() == pytest.approx(1.75)
    with first.open("ab") as f:
        f.write(struct.pack("<d", 4.0))
    with second.open("ab") as f:
        f.write(struct.pack("<d", 2.0)[3:])
    assert reader.read() == pytest.approx(6.0)
    assert reader.read() == 0.0
