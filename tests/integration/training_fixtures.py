"""Data and settings shared by the training tests: a tiny base model and a learnable correction task.

The task: each prompt starts with a topic word and the corrected answer depends only on it (six
topics, six two-word answers), so held-out prompts of a topic can be answered by an adapter that
learned the training corrections, and an adapter trained on shuffled answers cannot. Replay
traffic is random corpus prompts answered by the base model itself (greedy), as accepted traffic is.
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

import msgspec
import pytest

from entroloop.contract.ids import NodeStamper
from entroloop.contract.records import Audit, BadCase, Event, RetrainRequest
from entroloop.contract.settings import Settings

TOPIC_ANSWERS = {
    "alpha": "omega seven", "beta": "sigma two", "gamma": "kappa nine",
    "delta": "rho four", "theta": "psi one", "zeta": "mu six",
}
MODEL = "tiny-llama"

# Sized for a 2-core CPU: ~0.2 s per step with one torch thread.
TRAIN_OVERRIDES = {"cpu_threads": 1, "warmup_steps": 5}
# The tiny model's builder pins the EOS logit to zero, so it can never stop by itself: the gate
# reads exactly as many tokens as the correction has (a real model gets a few extra to stop in).
GATE_OVERRIDES = {"extra_tokens": 0}


def training_settings(tmp: Path, base_model: Path, **overrides) -> Settings:
    values = dict(
        data_dir=tmp / "data", base_model_path=str(base_model), base_model_name=MODEL,
        train_max_steps=150, train_batch_rows=4, train_seq_len=128, train_checkpoint_every=20,
        train_learning_rate=2e-2, train_precision="auto", train_replay_ratio=0.5,
    )
    values.update(overrides)
    return Settings(**values)


def greedy_responses(base_model: Path, prompts: list[str], max_new_tokens: int = 8) -> list[str]:
    """What the base model itself answers (greedy): accepted traffic is what the served model said."""
    import torch
    from entroloop.training.modeling import load_base_model, load_tokenizer, prompt_ids

    torch.set_num_threads(1)
    model, tokenizer = load_base_model(base_model), load_tokenizer(base_model)
    out = []
    with torch.no_grad():
        for prompt in prompts:
            ids = torch.tensor([prompt_ids(tokenizer, prompt)])
            gen = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                 max_new_tokens=max_new_tokens, pad_token_id=tokenizer.pad_token_id)
            out.append(tokenizer.decode(gen[0, ids.shape[1]:], skip_special_tokens=True))
    return out


def replay_prompts(seed: int = 2, n: int = 40) -> list[str]:
    from tests.integration.vllm_tiny_model import CORPUS_WORDS

    rng = random.Random(seed)
    filler = [w for w in CORPUS_WORDS if w not in TOPIC_ANSWERS]
    return [" ".join(rng.choice(filler) for _ in range(rng.randint(3, 8))) for _ in range(n)]


def correction_records(replay: list[tuple[str, str]], seed: int = 1, per_topic: int = 15,
                       shuffle_answers: bool = False) -> list[Event]:
    """Bad cases (topic prompt -> topic answer) plus accepted audit traffic (``replay`` pairs)."""
    from tests.integration.vllm_tiny_model import CORPUS_WORDS

    rng = random.Random(seed)
    stamper = NodeStamper("gateway")
    filler = [w for w in CORPUS_WORDS if w not in TOPIC_ANSWERS]
    prompts = [
        (topic, f"{topic} " + " ".join(rng.choice(filler) for _ in range(rng.randint(3, 8))))
        for topic in TOPIC_ANSWERS for _ in range(per_topic)
    ]
    answers = [TOPIC_ANSWERS[t] for t, _ in prompts]
    if shuffle_answers:
        rng.shuffle(answers)
    records: list[Event] = []
    for i, ((_, prompt), answer) in enumerate(zip(prompts, answers)):
        records.append(BadCase(**stamper.stamp(), request_id=f"bad-{i}", model=MODEL, prompt=prompt,
                               response="wrong", correction=answer, audit_id=f"audit-bad-{i}"))
    for i, (prompt, response) in enumerate(replay):
        records.append(Audit(**stamper.stamp(), request_id=f"ok-{i}", audit_id=f"audit-ok-{i}",
                             model=MODEL, prompt=prompt, response=response))
    return records


def retrain_request(trigger_key: str) -> RetrainRequest:
    return RetrainRequest(**NodeStamper("streams").stamp(), request_id=trigger_key, trigger_key=trigger_key,
                          model=MODEL, category="wrong_answer", reason="bad_case_count", bad_case_count=90)


def write_jsonl(records: list[Event], path: Path) -> Path:
    path.write_bytes(b"".join(msgspec.json.encode(r) + b"\n" for r in records))
    return path


def python() -> str:
    return sys.executable


_BUILT: dict[str, object] = {}


@pytest.fixture(scope="session")
def tiny_base_model(tmp_path_factory) -> Path:
    """The tiny random-weight Llama (tests/integration/vllm_tiny_model.py), built once per process."""
    if "model" not in _BUILT:
        from tests.integration.vllm_tiny_model import build_tiny_llama

        folder = build_tiny_llama(tmp_path_factory.mktemp("tiny-llama") / "model")
        _BUILT["model"] = set_lm_head_scale(folder, TRAINING_LM_HEAD_SCALE)
    return _BUILT["model"]  # type: ignore[return-value]


# The shared builder sharpens its output head for the entropy tests (LM_HEAD_SCALE there); a head
# that sharp needs many more LoRA steps to move an argmax, so the training tests pin their own
# scale instead of inheriting whatever the entropy tests need next.
TRAINING_LM_HEAD_SCALE = 0.4


def set_lm_head_scale(folder: Path, scale: float) -> Path:
    """Rescale the saved model's output head so its weights have std ``scale`` (rewrites weights)."""
    import torch
    from transformers import LlamaForCausalLM

    from tests.integration import vllm_tiny_model

    model = LlamaForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight.mul_(scale / vllm_tiny_model.LM_HEAD_SCALE)
    model.save_pretrained(str(folder), safe_serialization=True)
    return folder


@pytest.fixture(scope="session")
def replay_pairs(tiny_base_model) -> list[tuple[str, str]]:
    """Accepted traffic: replay prompts with the base model's own greedy answers (built once)."""
    if "replay" not in _BUILT:
        prompts = replay_prompts()
        _BUILT["replay"] = list(zip(prompts, greedy_responses(tiny_base_model, prompts)))
    return _BUILT["replay"]  # type: ignore[return-value]
