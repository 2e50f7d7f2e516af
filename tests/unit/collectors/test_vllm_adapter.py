"""The vLLM adapter with vLLM's own BatchUpdate types and fake Model Runner V2 contexts (no engine).

Marked ``vllm``: imports vLLM and torch, so it runs in .venv-ml. Model Runner V2 needs Triton
kernels that the CPU build lacks, so its interface is exercised here with hand-built contexts.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

pytestmark = pytest.mark.vllm

SHIPPED: list = []


@pytest.fixture()
def processor_env(monkeypatch: pytest.MonkeyPatch):
    SHIPPED.clear()
    monkeypatch.setenv("ENTROLOOP_ENTROPY_TAP_SINK", f"{__name__}:ship")
    monkeypatch.setenv("ENTROLOOP_NODE_ID", "unit-node")
    monkeypatch.setenv("ENTROLOOP_ENTROPY_TAP_ENABLED", "true")
    return SHIPPED


def ship(record) -> None:
    SHIPPED.append(record)


def fake_vllm_config(max_num_seqs: int = 8):
    return SimpleNamespace(
        model_config=SimpleNamespace(served_model_name="tiny", model="/models/tiny", get_vocab_size=lambda: 500),
        scheduler_config=SimpleNamespace(max_num_seqs=max_num_seqs),
    )


def reference(row: np.ndarray) -> float:
    z = row.astype(np.float64)
    z = z - z.max()
    p = np.exp(z) / np.exp(z).sum()
    nz = p > 0
    return float(-(p[nz] * np.log(p[nz])).sum())


def params(request_id: str, temperature: float = 1.0):
    from vllm import SamplingParams

    return SamplingParams(max_tokens=8, temperature=temperature, extra_args={"entroloop_request_id": request_id})


TEMPERATURES = {"a": 1.0, "b": 2.0, "c": 0.0, "x": 0.5, "y": 1.0}  # c: greedy


def test_v1_interface_tracks_rows_and_returns_logits_unchanged(processor_env) -> None:
    import torch
    from entroloop.collectors.vllm.vllm_adapter import EntropyTapLogitsProcessor
    from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

    proc = EntropyTapLogitsProcessor(fake_vllm_config(), torch.device("cpu"), False)
    assert proc.mode == "v1" and proc.is_argmax_invariant() is False
    # compiled at engine start (warm_up for the model's vocabulary), not in the first serving step
    assert proc.tap.entropy.fallback is None and proc.tap.entropy._z.shape[1] == 500
    gen = torch.Generator().manual_seed(0)
    outputs = {"a": [], "b": [], "c": []}
    expected: dict[str, list[float]] = {k: [] for k in outputs}
    surprisals: dict[str, list[float]] = {k: [] for k in outputs}
    sampling: dict[str, list[float]] = {k: [] for k in outputs}

    def run_step(owners: list[str]) -> None:
        logits = torch.randn(len(owners), 500, generator=gen) * torch.arange(1, len(owners) + 1).unsqueeze(1)
        before = logits.clone()
        out = proc.apply(logits)
        assert out is logits and torch.equal(out, before)  # unchanged, not copied
        for row, owner in enumerate(owners):
            expected[owner].append(reference(before[row].numpy()))
            if TEMPERATURES[owner] > 0:
                sampling[owner].append(reference(before[row].numpy() / TEMPERATURES[owner]))
            # vLLM samples after the processors and appends the id to the request's list
            token = int(torch.randint(0, 500, (1,), generator=gen))
            surprisals[owner].append(-float(torch.log_softmax(before[row].double(), -1)[token]))
            outputs[owner].append(token)

    proc.update_state(
        BatchUpdate(batch_size=2, removed=[], moved=[],
                    added=[(0, params("a", 1.0), [1, 2], outputs["a"]), (1, params("b", 2.0), [3], outputs["b"])])
    )
    run_step(["a", "b"])
    proc.update_state(None)
    run_step(["a", "b"])
    # a finishes; c arrives at row 2 and is condensed into row 0; then a swap.
    proc.update_state(
        BatchUpdate(batch_size=2, removed=[0], added=[(2, params("c", 0.0), [4], outputs["c"])],
                    moved=[(2, 0, MoveDirectionality.UNIDIRECTIONAL)])
    )
    assert [r.request_id for r in SHIPPED] == ["a"]
    run_step(["c", "b"])
    proc.update_state(BatchUpdate(batch_size=2, removed=[], added=[], moved=[(0, 1, MoveDirectionality.SWAP)]))
    run_step(["b", "c"])
    proc.update_state(BatchUpdate(batch_size=0, removed=[0, 1], added=[], moved=[]))

    by_id = {r.request_id: r for r in SHIPPED}
    assert sorted(by_id) == ["a", "b", "c"]
    for request_id, values in expected.items():
        record = by_id[request_id]
        np.testing.assert_allclose(record.values().astype(np.float64), values, atol=2e-3)
        # each sampled token's surprisal, gathered one step late (float16 on the wire)
        np.testing.assert_allclose(record.surprisal_values().astype(np.float64), surprisals[request_id], rtol=2e-3)
        assert record.hashes().tolist() == outputs[request_id]
        # the entropy at the request's own temperature; greedy requests carry none
        if sampling[request_id]:
            np.testing.assert_allclose(record.sampling_values().astype(np.float64), sampling[request_id], atol=4e-3)
        else:
            assert record.sampling_values() is None
        assert record.model == "tiny" and record.node_id == "unit-node" and record.final
    assert len({r.seq for r in SHIPPED}) == 3
    assert np.array_equal(by_id["a"].sampling_values(), by_id["a"].values())  # T = 1: the entropy itself
    assert (by_id["b"].sampling_values() > by_id["b"].values()).all()  # hotter is flatter


def test_v2_interface_maps_reordered_rows_to_slots(processor_env) -> None:
    import torch
    from entroloop.collectors.vllm.vllm_adapter import EntropyTapLogitsProcessor

    prompt_len = np.zeros(8, dtype=np.int32)
    req_states = SimpleNamespace(device=torch.device("cpu"), max_num_reqs=8, prompt_len=SimpleNamespace(np=prompt_len))
    proc = EntropyTapLogitsProcessor(fake_vllm_config(), req_states)
    assert proc.mode == "v2"
    prompt_len[5], prompt_len[2] = 4, 6
    assert proc.add_request(5, params("x", 0.5)) is True
    assert proc.add_request(2, params("y", 1.0)) is True

    gen = torch.Generator().manual_seed(1)
    expected: dict[str, list[float]] = {"x": [], "y": []}
    sampling: dict[str, list[float]] = {"x": [], "y": []}
    # (row order, seq len per row): slot 2 is still prefilling (3 of 6 prompt tokens) at step 1.
    steps = [([5, 2], [4, 3]), ([2, 5], [6, 5]), ([5, 2], [6, 7])]
    for order, seq_lens in steps:
        logits = torch.randn(2, 300, generator=gen) * 2
        ctx = SimpleNamespace(idx_mapping_np=np.array(order), seq_lens_upper_bound_np=np.array(seq_lens))
        assert proc.apply(logits, ctx) is logits
        for row, (slot, seq_len) in enumerate(zip(order, seq_lens)):
            if seq_len >= prompt_len[slot]:
                owner = "x" if slot == 5 else "y"
                expected[owner].append(reference(logits[row].numpy()))
                sampling[owner].append(reference(logits[row].numpy() / TEMPERATURES[owner]))
    # Slot 5 is reused by a new request: its previous occupant is shipped.
    proc.add_request(5, params("z"))
    assert [r.request_id for r in SHIPPED] == ["x"]
    proc.tap.flush()
    by_id = {r.request_id: r for r in SHIPPED}
    for request_id, values in expected.items():
        np.testing.assert_allclose(by_id[request_id].values().astype(np.float64), values, atol=2e-3)
        np.testing.assert_allclose(by_id[request_id].sampling_values().astype(np.float64), sampling[request_id], atol=4e-3)
    assert by_id["y"].n_tokens == 2  # the partial-prefill step was not credited


def unmeasured(request_id: str):
    from vllm import SamplingParams

    return SamplingParams(max_tokens=8, extra_args={"entroloop_request_id": request_id, "entroloop_tap": False})


def test_a_request_that_opts_out_is_not_measured_and_evicts_its_rows_occupant_v1(processor_env) -> None:
    import torch
    from entroloop.collectors.vllm.vllm_adapter import EntropyTapLogitsProcessor
    from vllm.v1.sample.logits_processor import BatchUpdate, MoveDirectionality

    proc = EntropyTapLogitsProcessor(fake_vllm_config(), torch.device("cpu"), False)
    out_a: list[int] = []
    proc.update_state(BatchUpdate(batch_size=2, removed=[], moved=[],
                                  added=[(0, params("a"), [1], out_a), (1, unmeasured("quiet"), [2], [])]))
    for _ in range(3):
        proc.apply(torch.randn(2, 100))
        out_a.append(7)  # vLLM samples a's token after the processors
    # "quiet2" takes a's row without a removal of a (vLLM's add evicts the occupant), then is moved
    proc.update_state(BatchUpdate(batch_size=2, removed=[], moved=[(0, 1, MoveDirectionality.SWAP)],
                                  added=[(0, unmeasured("quiet2"), [3], [])]))
    assert [r.request_id for r in SHIPPED] == ["a"] and SHIPPED[0].n_tokens == 3
    proc.apply(torch.randn(2, 100))
    proc.tap.flush()
    assert [r.request_id for r in SHIPPED] == ["a"]  # the opted-out requests left no record
    assert proc.tap.steps == 3  # and no reduction ran once no measured request was in the batch


def test_a_request_that_opts_out_is_not_measured_v2(processor_env) -> None:
    import torch
    from entroloop.collectors.vllm.vllm_adapter import EntropyTapLogitsProcessor

    prompt_len = np.zeros(8, dtype=np.int32)
    req_states = SimpleNamespace(device=torch.device("cpu"), max_num_reqs=8, prompt_len=SimpleNamespace(np=prompt_len))
    proc = EntropyTapLogitsProcessor(fake_vllm_config(), req_states)
    assert proc.add_request(3, params("x")) is True
    ctx = SimpleNamespace(idx_mapping_np=np.array([3]), seq_lens_upper_bound_np=np.array([1]))
    proc.apply(torch.randn(1, 50), ctx)
    assert proc.add_request(3, unmeasured("quiet")) is False  # vLLM will not call us for it
    assert [r.request_id for r in SHIPPED] == ["x"]  # the slot's previous occupant was shipped
    proc.apply(torch.randn(1, 50), ctx)
    proc.tap.flush()
    assert [r.request_id for r in SHIPPED] == ["x"]


def test_the_tap_times_itself_into_the_timings_file_when_one_is_set(processor_env, tmp_path, monkeypatch) -> None:
    import struct

    import torch
    from entroloop.collectors.vllm.vllm_adapter import EntropyTapLogitsProcessor
    from vllm.v1.sample.logits_processor import BatchUpdate

    monkeypatch.setenv("ENTROLOOP_ENTROPY_TAP_TIMINGS", str(tmp_path / "tap-{pid}.bin"))
    proc = EntropyTapLogitsProcessor(fake_vllm_config(), torch.device("cpu"), False)
    out: list[int] = []
    proc.update_state(BatchUpdate(batch_size=1, removed=[], moved=[], added=[(0, params("a"), [1], out)]))
    proc.update_state(None)  # no update this step: nothing to time
    for _ in range(3):
        proc.apply(torch.randn(1, 20_000))
        out.append(1)
    proc.update_state(BatchUpdate(batch_size=0, removed=[0], moved=[], added=[]))
    (timings,) = tmp_path.glob("tap-*.bin")
    seconds = [s for (s,) in struct.iter_unpack("<d", timings.read_bytes())]
    assert len(seconds) == 5  # two batch updates and three logits steps, in call order
    assert all(0 < s < 5 for s in seconds)
    assert [r.request_id for r in SHIPPED] == ["a"]
    # a write that fails (a full disk; here the descriptor closed under it) stops the timing, not the step
    import os

    os.close(proc._timings)
    proc.apply(torch.randn(1, 20_000))
    assert proc._timings is None


def test_an_unwritable_timings_file_is_a_config_error_naming_the_setting(processor_env, tmp_path, monkeypatch) -> None:
    import torch
    from entroloop.collectors.vllm.vllm_adapter import EntropyTapLogitsProcessor

    monkeypatch.setenv("ENTROLOOP_ENTROPY_TAP_TIMINGS", str(tmp_path / "missing-folder" / "tap.bin"))
    with pytest.raises(ValueError, match="ENTROLOOP_ENTROPY_TAP_TIMINGS=.*cannot append.*leave the setting empty"):
        EntropyTapLogitsProcessor(fake_vllm_config(), torch.device("cpu"), False)


def test_disabled_tap_is_inert(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch
    from entroloop.collectors.vllm.vllm_adapter import EntropyTapLogitsProcessor

    monkeypatch.setenv("ENTROLOOP_ENTROPY_TAP_ENABLED", "false")
    proc = EntropyTapLogitsProcessor(fake_vllm_config(), torch.device("cpu"), False)
    logits = torch.randn(2, 10)
    assert proc.tap is None and proc.apply(logits) is logits


def test_validate_params_rejects_non_string_ids() -> None:
    from entroloop.collectors.vllm.vllm_adapter import EntropyTapLogitsProcessor
    from vllm import SamplingParams

    EntropyTapLogitsProcessor.validate_params(SamplingParams(extra_args={"entroloop_request_id": "ok"}))
    with pytest.raises(ValueError):
        EntropyTapLogitsProcessor.validate_params(SamplingParams(extra_args={"entroloop_request_id": 7}))
    EntropyTapLogitsProcessor.validate_params(SamplingParams(extra_args={"entroloop_tap": False}))
    with pytest.raises(ValueError, match="entroloop_tap must be true or false"):
        EntropyTapLogitsProcessor.validate_params(SamplingParams(extra_args={"entroloop_tap": "no"}))


def test_entropy_per_row_handles_masked_tokens() -> None:
    import torch
    from entroloop.collectors.vllm.entropy import entropy_per_row

    logits = torch.randn(4, 64, dtype=torch.bfloat16)
    logits[1, 1:] = float("-inf")  # one token left: entropy exactly 0
    logits[2, ::2] = float("-inf")
    got = entropy_per_row(logits)
    assert got.dtype == torch.float32 and got[1].item() == 0.0
    for row in (0, 2, 3):
        assert abs(got[row].item() - reference(logits[row].float().numpy())) < 1e-5


@pytest.mark.parametrize(("scale", "shift"), [(0.01, 0.0), (1.0, 0.0), (3.0, 0.0), (10.0, 20.0), (30.0, 0.0)])
def test_entropy_per_row_is_accurate_at_every_logit_scale(scale: float, shift: float) -> None:
    """Confident rows (large logits) are where a logsumexp-minus-dot form cancels in float32."""
    import torch
    from entroloop.collectors.vllm.entropy import entropy_per_row

    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(8, 32000, generator=gen) * scale + shift
    p = torch.softmax(logits.double(), -1)
    expected = torch.special.entr(p).sum(-1)
    assert (entropy_per_row(logits).double() - expected).abs().max().item() < 5e-5
