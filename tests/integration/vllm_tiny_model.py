"""A tiny random-weight Llama-style model and its tokenizer, built locally (no downloads).

Head size 64 (hidden 128, 2 heads) because vLLM's CPU attention kernels reject smaller heads.
The output head is scaled up so the next-token distributions are peaked and differ from context
to context: with default initialisation every distribution is almost uniform (entropy ~ log V for
every token), which would make a test unable to tell one request's values from another's.
"""

from __future__ import annotations

from pathlib import Path

CORPUS_WORDS = (
    "the a entropy token model serving node request batch stream kafka audit span trace loop "
    "gibberish answer question user tenant route adapter lora retrain gate canary promote rollback "
    "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma "
    "tau upsilon phi chi psi omega one two three four five six seven eight nine ten"
).split()

VOCAB_SIZE = 1024
LM_HEAD_SCALE = 1.0  # entropies spread over ~0-2 nats: varied per context, float16 error < 5e-4 there


def _corpus(lines: int = 2000) -> list[str]:
    import random

    rng = random.Random(7)
    return [" ".join(rng.choice(CORPUS_WORDS) for _ in range(rng.randint(4, 24))) for _ in range(lines)]


def build_tokenizer(folder: Path):
    """Train a small byte-level BPE tokenizer on a synthetic corpus and save it as a HF tokenizer."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE - 8,
        special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )
    fast.save_pretrained(folder)
    return fast


def build_tiny_llama(folder: Path, seed: int = 1234) -> Path:
    """Write config, random weights (safetensors) and tokenizer of a tiny Llama to ``folder``."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    folder.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(folder)
    config = LlamaConfig(
        vocab_size=VOCAB_SIZE,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(LM_HEAD_SCALE / config.initializer_range)
        # Never generate EOS early: every request runs to its own max_tokens, so lengths are known.
        model.lm_head.weight[tokenizer.eos_token_id].zero_()
    model.save_pretrained(folder, safe_serialization=True)
    return folder


def _generated_log_probs(folder: Path, prompt_ids: list[int], output_ids: list[int]):
    """log_softmax (float64) at each generated token's step, from a plain transformers forward pass."""
    import torch

    model = _cached_model(str(folder))
    ids = torch.tensor([prompt_ids + output_ids])
    with torch.no_grad():
        logits = model(ids).logits[0].double()
    # Logits at position t predict token t+1: the first generated token comes from the last prompt
    # position.
    steps = logits[len(prompt_ids) - 1 : len(prompt_ids) - 1 + len(output_ids)]
    return torch.log_softmax(steps, dim=-1)


def reference_entropies(folder: Path, prompt_ids: list[int], output_ids: list[int],
                        temperature: float = 1.0) -> list[float]:
    """Entropy (nats) of each generated token, float64; at ``temperature``: of softmax(logits / T)."""
    import torch

    logp = _generated_log_probs(folder, prompt_ids, output_ids)
    if temperature != 1.0:
        logp = torch.log_softmax(logp / temperature, dim=-1)  # log_softmax(logits) / T differs by a constant per row
    return (-(logp.exp() * logp).sum(-1)).tolist()


def reference_surprisals(folder: Path, prompt_ids: list[int], output_ids: list[int]) -> list[float]:
    """-log p (nats) of each generated token under the model (before temperature), float64."""
    import torch

    logp = _generated_log_probs(folder, prompt_ids, output_ids)
    return (-logp[torch.arange(len(output_ids)), torch.tensor(output_ids)]).tolist()


_MODELS: dict[str, object] = {}


def _cached_model(folder: str):
    from transformers import LlamaForCausalLM

    if folder not in _MODELS:
        model = LlamaForCausalLM.from_pretrained(folder, torch_dtype="float32")
        model.eval()
        _MODELS[folder] = model
    return _MODELS[folder]
