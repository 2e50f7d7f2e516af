"""The retraining loop with real PEFT on a tiny random-weight Llama built by the test (CPU).

Run in .venv-ml: ``.venv-ml/bin/python -m pytest -m training tests/integration/test_training_loop.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import time
from pathlib import Path

import pytest
from entroloop.training.actions import ActionLog
from entroloop.training.dataset import CORRECTION, TrainingData
from entroloop.training.jobs import JobRunner, JobStore
from entroloop.training.pipeline import JsonLinesSource, MemorySource, TrainingPipeline
from entroloop.training.registry import AdapterRegistry

from entroloop.infra.worm.worm_store import LocalWormStore
from tests.integration.training_fixtures import (
    GATE_OVERRIDES,
    TRAIN_OVERRIDES,
    correction_records,
    python,
    replay_pairs,  # noqa: F401 - fixture
    retrain_request,
    tiny_base_model,  # noqa: F401 - fixture
    training_settings,
    write_jsonl,
)

pytestmark = pytest.mark.training

REPO = Path(__file__).resolve().parents[2]


def _runner(tmp_path, base, records, registry=None, actions=None, **settings):
    actions = actions or ActionLog()
    s = training_settings(tmp_path, base, **settings)
    pipeline = TrainingPipeline(s, MemorySource(records), registry, train_overrides=TRAIN_OVERRIDES,
                                gate_overrides=GATE_OVERRIDES, progress=False)
    return JobRunner(JobStore(tmp_path / "training"), pipeline.steps(), actions), actions


def test_job_learns_corrections_passes_gate_and_is_registered(tmp_path, tiny_base_model, replay_pairs, chdb_client,
                                                               ch_database):
    actions = ActionLog()
    registry = AdapterRegistry(LocalWormStore(tmp_path / "adapters"), chdb_client, ch_database, actions)
    registry.ensure_schema()
    runner, _ = _runner(tmp_path, tiny_base_model, correction_records(replay_pairs), registry, actions)

    job = runner.submit(retrain_request("tiny-llama/wrong_answer/h1"))
    status = job.status()
    assert status["state"] == "accepted", status.get("results", {}).get("gate")
    results = status["results"]

    # The loss on the corrections falls (measured with the same code before and after).
    from entroloop.training.modeling import (
        load_base_model,
        load_tokenizer,
        mean_completion_loss,
    )
    from peft import PeftModel

    data = TrainingData.load(job.work / "dataset.json")
    corrections = [e for e in data.train if e.source == CORRECTION]
    tokenizer = load_tokenizer(tiny_base_model)
    before = mean_completion_loss(load_base_model(tiny_base_model), tokenizer, corrections, 128)
    adapted = PeftModel.from_pretrained(load_base_model(tiny_base_model), str(job.work / "adapter"))
    after = mean_completion_loss(adapted, tokenizer, corrections, 128)
    print(f"correction loss {before:.3f} -> {after:.3f}; gate {results['gate']}")
    assert after < before * 0.5

    gate = results["gate"]
    assert gate["adapter_pass_rate"] >= 0.8 and gate["parent_pass_rate"] == 0.0
    assert gate["adapter_loss"] <= gate["parent_loss"] * 1.05
    assert results["train"]["steps"] == 150 and results["train"]["resumed_from_step"] == 0

    adapter_id = results["register"]["adapter_id"]
    manifest = registry.manifest(adapter_id)
    assert manifest.dataset_digest == data.digest and manifest.base_model_digest.startswith("sha256:")
    assert set(manifest.files) >= {"adapter_config.json", "adapter_model.safetensors"}
    assert registry.status(adapter_id) == "candidate"
    key = "tiny-llama/wrong_answer/h1"
    assert actions.names(key) == [
        "retrain.claimed", "dataset.completed", "train.completed", "gate.completed", "register.completed",
    ]
    assert "adapter.registered" in actions.names(adapter_id)

    # The same trigger again starts no second job.
    assert runner.submit(retrain_request(key)) is None
    assert actions.names(key)[-1] == "retrain.duplicate"
    assert len(JobStore(tmp_path / "training").jobs()) == 1 and len(registry.list()) == 1


def test_gate_rejects_adapter_trained_on_shuffled_targets(tmp_path, tiny_base_model, replay_pairs):
    runner, actions = _runner(tmp_path, tiny_base_model, correction_records(replay_pairs, shuffle_answers=True))
    job = runner.submit(retrain_request("tiny-llama/wrong_answer/shuffled"))
    status = job.status()
    gate = status["results"]["gate"]
    print("shuffled gate", gate)
    assert status["state"] == "rejected"
    assert gate["adapter_pass_rate"] < 0.5 and gate["reasons"]
    assert actions.records[-1].action == "gate.completed" and actions.records[-1].outcome == "rejected"


RUN_JOB = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from tests.integration.training_fixtures import GATE_OVERRIDES, TRAIN_OVERRIDES, retrain_request, training_settings
    from entroloop.training.actions import ActionLog
    from entroloop.training.jobs import JobRunner, JobStore
    from entroloop.training.pipeline import JsonLinesSource, TrainingPipeline
    tmp, base, records = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])
    settings = training_settings(tmp, base, train_max_steps=150, train_checkpoint_every=10)
    pipeline = TrainingPipeline(settings, JsonLinesSource([records]), None, train_overrides=TRAIN_OVERRIDES,
                                gate_overrides=GATE_OVERRIDES, progress=False)
    JobRunner(JobStore(tmp / "training"), pipeline.steps(), ActionLog()).submit(retrain_request("crash-key"))
    """
)


def test_job_killed_mid_training_resumes_from_checkpoint(tmp_path, tiny_base_model, replay_pairs):
    records = write_jsonl(correction_records(replay_pairs), tmp_path / "records.jsonl")
    proc = subprocess.Popen([python(), "-c", RUN_JOB, str(tmp_path), str(tiny_base_model), str(records)],
                            cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    ckpts = None
    deadline = time.monotonic() + 240
    try:
        while time.monotonic() < deadline and proc.poll() is None:
            found = list((tmp_path / "training" / "jobs").glob("*/work/checkpoints/step-*/meta.json"))
            if found:
                ckpts = found
                break
            time.sleep(0.05)
        assert ckpts, f"no checkpoint appeared (exit code {proc.poll()})"
        os.kill(proc.pid, signal.SIGKILL)  # no chance to clean up: the real crash
    finally:
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL
    store = JobStore(tmp_path / "training")
    (job,) = store.resumable()
    assert job.state == "train"
    killed_at = max(json.loads(p.read_text())["step"] for p in ckpts)

    settings = training_settings(tmp_path, tiny_base_model, train_max_steps=150, train_checkpoint_every=10)
    pipeline = TrainingPipeline(settings, JsonLinesSource([records]), None, train_overrides=TRAIN_OVERRIDES,
                                gate_overrides=GATE_OVERRIDES, progress=False)
    actions = ActionLog()
    runner = JobRunner(store, pipeline.steps(), actions)
    assert runner.submit(retrain_request("crash-key")) is None  # no second job for the key
    (resumed,) = runner.resume_all()
    status = resumed.status()
    train = status["results"]["train"]
    print("resume", killed_at, train)
    assert train["resumed_from_step"] >= killed_at >= 10
    assert train["steps"] == 150 and train["steps_run_now"] == 150 - train["resumed_from_step"]
    assert status["attempts"] == 2 and status["steps_done"][0] == "dataset"
    assert actions.names("crash-key")[:2] == ["retrain.duplicate", "retrain.resumed"]
    assert status["state"] == "accepted", status["results"]["gate"]


def test_bf16_autocast_path_trains(tmp_path, tiny_base_model):
    """bf16 is chosen automatically only on hardware that has it; forced here so the CPU runs its path."""
    import math

    from entroloop.training.dataset import Example
    from entroloop.training.trainer import LoraTrainer, TrainConfig

    examples = [Example(f"alpha {i} beta", "omega seven", CORRECTION, str(i)) for i in range(8)]
    config = TrainConfig(max_steps=6, batch_rows=2, seq_len=64, checkpoint_every=3, precision="bf16",
                         cpu_threads=1, learning_rate=1e-2, warmup_steps=1)
    result = LoraTrainer(tiny_base_model, config, progress=False).train(examples, tmp_path)
    assert result.precision == "bf16" and all(math.isfinite(x) for x in result.losses)
    assert min(result.losses[1:]) < result.losses[0]
    assert (tmp_path / "adapter" / "adapter_model.safetensors").exists()


def test_resumed_training_takes_exactly_the_uninterrupted_steps(tmp_path, tiny_base_model):
    """Data order and learning rate depend on the step only, so crash + resume = no crash."""
    from entroloop.training.dataset import Example
    from entroloop.training.trainer import LoraTrainer, TrainConfig

    examples = [Example(f"{t} {i} beta", a, CORRECTION, f"{t}{i}")
                for i in range(6) for t, a in (("alpha", "omega seven"), ("beta", "sigma two"))]
    config = TrainConfig(max_steps=8, batch_rows=2, seq_len=32, checkpoint_every=4, precision="fp32",
                         cpu_threads=1, learning_rate=1e-2, warmup_steps=2)
    straight = LoraTrainer(tiny_base_model, config, progress=False).train(examples, tmp_path / "straight")

    class Crash(Exception):
        pass

    def crash_after_checkpoint(step: int, loss: float) -> None:
        if step == 5:
            raise Crash

    with pytest.raises(Crash):
        LoraTrainer(tiny_base_model, config, progress=False, on_step=crash_after_checkpoint).train(
            examples, tmp_path / "crashed")
    resumed = LoraTrainer(tiny_base_model, config, progress=False).train(examples, tmp_path / "crashed")
    assert resumed.resumed_from_step == 4 and resumed.steps_run_now == 4
    assert resumed.losses == pytest.approx(straight.losses, rel=1e-5, abs=1e-6)
    a = (tmp_path / "straight" / "adapter" / "adapter_model.safetensors").read_bytes()
    b = (tmp_path / "crashed" / "adapter" / "adapter_model.safetensors").read_bytes()
    from safetensors.torch import load

    wa, wb = load(a), load(b)
    assert wa.keys() == wb.keys()
    assert all(float((wa[k] - wb[k]).abs().max()) < 1e-5 for k in wa)
