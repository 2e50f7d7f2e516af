"""The entropy tap inside the real vLLM engine (CPU build) with a tiny model built by the test.

Runs in .venv-ml (scripts/install_ml_env.sh). The tap is *not* passed to the engine: vLLM loads it
from entroloop's ``vllm.logits_processors`` entry point, configured only by environment variables,
exactly as on a serving node. It runs in vLLM's engine-core subprocess and ships its records to a
file sink that the test reads back.

Checked: one final record per request, as many values as generated tokens, every value within
1e-3 nats of a float64 transformers forward pass over prompt + generated tokens with the same
weights, and each value's token hash equal to the token id vLLM returned — with more requests than batch rows and different lengths, so rows are removed, added
and condensed (moved) mid-flight and a mix-up between requests would show.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.vllm

# The tap's values are float32 reductions of float32 logits, shipped as float16: for entropies
# below 2 nats float16 rounds by at most 2**-11 * 2 ≈ 0.00049, so 1e-3 holds end to end.
TOLERANCE = 1e-3
MAX_NUM_SEQS = 3

PROMPTS = [
    "the entropy of a token",
    "kafka stream audit span trace loop gibberish answer question user tenant",
    "alpha beta",
    "one two three four five six seven eight nine ten alpha beta gamma delta epsilon zeta eta",
    "lora retrain gate canary",
    "model serving node request batch",
    "sigma tau",
]
MAX_TOKENS = [12, 3, 20, 7, 15, 1, 9]
TEMPERATURES = [0.0 if i % 2 == 0 else 1.0 if i % 4 == 1 else 1.7 for i in range(len(MAX_TOKENS))]
"""Greedy for every other request; the others sampled at T=1 or hotter."""


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.integration.vllm_tiny_model import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


def read_records(folder: Path) -> list:
    from entroloop.collectors.vllm.emit import read_frames

    records = []
    for path in sorted(folder.glob("tokens-*.bin")):
        records.extend(read_frames(path))
    return records


def wait_for_records(folder: Path, expected: int, timeout_s: float = 60.0) -> list:
    """The last requests are shipped at the engine step that removes them from the batch."""
    deadline = time.monotonic() + timeout_s
    records = read_records(folder)
    while len(records) < expected and time.monotonic() < deadline:
        time.sleep(0.2)
        records = read_records(folder)
    return records


@pytest.fixture()
def engine_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    sink_folder = tmp_path / "sink"
    monkeypatch.setenv("ENTROLOOP_ENTROPY_TAP_SINK", f"file:{sink_folder}/tokens-{{pid}}.bin")
    monkeypatch.setenv("ENTROLOOP_NODE_ID", "vllm-test-node")
    monkeypatch.setenv("ENTROLOOP_ENTROPY_TAP_ENABLED", "true")
    # The V1 model runner: the interface with added/removed/moved batch updates.
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")
    return sink_folder


def test_entry_point_registers_the_tap() -> None:
    from importlib.metadata import entry_points

    targets = {ep.value for ep in entry_points(group="vllm.logits_processors")}
    assert "entroloop.collectors.vllm.vllm_adapter:EntropyTapLogitsProcessor" in targets


def test_entropies_from_the_engine_match_a_transformers_forward_pass(
    tiny_model: Path, engine_env: Path
) -> None:
    from vllm import LLM, SamplingParams

    from tests.integration.vllm_tiny_model import reference_entropies

    llm = LLM(
        model=str(tiny_model),
        dtype="float32",
        enforce_eager=True,
        max_model_len=256,
        max_num_seqs=MAX_NUM_SEQS,  # fewer rows than requests: rows get reused and condensed
        gpu_memory_utilization=0.1,
        seed=0,
    )
    params = [
        SamplingParams(
            # greedy, and sampled for every other request (tokens the model did not rank first),
            # at T=1 or hotter
            temperature=TEMPERATURES[i],
            seed=i,
            max_tokens=n,
            ignore_eos=True,
            logprobs=0,  # the sampled token's logprob, the model's own (vLLM's default raw mode)
            extra_args={"entroloop_request_id": f"req-{i}", "entroloop_trace_id": f"{i:032x}",
                        **({"entroloop_route": "support"} if i % 2 else {})},
        )
        for i, n in enumerate(MAX_TOKENS)
    ]
    outputs = llm.generate(PROMPTS, params, use_tqdm=False)
    records = wait_for_records(engine_env, expected=len(PROMPTS))
    del llm

    by_id = {r.request_id: r for r in records}
    assert sorted(by_id) == sorted(f"req-{i}" for i in range(len(PROMPTS))), [r.request_id for r in records]
    assert len(records) == len(PROMPTS), "one record per request (no duplicate, no split)"
    worst = surprisal_worst = sampling_worst = 0.0
    for i, output in enumerate(outputs):
        record = by_id[f"req-{i}"]
        generated = list(output.outputs[0].token_ids)
        assert len(generated) == MAX_TOKENS[i]
        assert record.final and record.chunk_index == 0 and record.first_token_index == 0
        assert record.trace_id == f"{i:032x}"
        assert record.route == ("support" if i % 2 else "default"), "the gateway's route, else the node's"
        assert record.node_id == "vllm-test-node"
        assert record.model == str(tiny_model)
        shipped = record.values().astype(np.float64)
        assert record.n_tokens == len(generated), (i, record.n_tokens, len(generated))
        # The per-token hashes are the sampled ids, read from vLLM's own output list: they must be
        # exactly the ids vLLM returned to the caller, one per entropy.
        hashes = record.hashes()
        assert hashes is not None, f"req-{i}: the tap shipped no token hashes"
        assert hashes.tolist() == [t % 2**32 for t in generated], (i, hashes.tolist(), generated)
        expected = np.array(reference_entropies(tiny_model, list(output.prompt_token_ids), generated))
        assert expected.max() < 2.0, "the tiny model must keep entropies where float16 error < 5e-4"
        error = np.abs(shipped - expected)
        worst = max(worst, float(error.max()))
        assert error.max() <= TOLERANCE, (i, shipped, expected)
        # The tap's surprisals (gathered one step late) are vLLM's own sampled-token logprobs.
        surprisals = record.surprisal_values()
        assert surprisals is not None, f"req-{i}: the tap shipped no surprisals"
        engine = [-step[token].logprob for step, token in zip(output.outputs[0].logprobs, generated)]
        np.testing.assert_allclose(surprisals.astype(np.float64), engine, rtol=2e-3, atol=1e-3)
        surprisal_worst = max(surprisal_worst, float(np.abs(surprisals - np.array(engine)).max()))
        # Sampling entropies: the entropy at the request's own temperature; none for greedy ones.
        sampling = record.sampling_values()
        if TEMPERATURES[i] == 0.0:
            assert sampling is None, f"req-{i}: greedy, yet the tap shipped sampling entropies"
            continue
        assert sampling is not None, f"req-{i}: sampled at T={TEMPERATURES[i]}, yet no sampling entropies"
        at_t = np.array(reference_entropies(tiny_model, list(output.prompt_token_ids), generated, TEMPERATURES[i]))
        np.testing.assert_allclose(sampling.astype(np.float64), at_t, rtol=1e-3, atol=TOLERANCE)
        sampling_worst = max(sampling_worst, float(np.abs(sampling - at_t).max()))
        if TEMPERATURES[i] > 1.0:
            assert (at_t > expected).all(), "hotter is flatter: the reference itself must say so"
    # The values must actually distinguish requests, or "not mixed" would be vacuous.
    firsts = {round(float(by_id[f"req-{i}"].values()[0]), 2) for i in range(len(PROMPTS))}
    assert len(firsts) >= len(PROMPTS) - 1
    sampled = [s for i, o in enumerate(outputs) if i % 2 for s in by_id[f"req-{i}"].surprisal_values()]
    assert max(sampled) > 1.0, "sampled requests must include tokens the model did not rank first"
    print(f"worst |tap - reference| = {worst:.2e} nats over {sum(MAX_TOKENS)} tokens; "
          f"worst |tap surprisal - vLLM logprob| = {surprisal_worst:.2e}; "
          f"worst |tap sampling entropy - reference at T| = {sampling_worst:.2e}")

