"""Torch helpers shared by the trainer and the gate: loading, encoding pairs, packing, loss.

torch and transformers are imported inside functions: this module is imported by the CLI, which
must start in the light virtualenv (no torch) for ``entroloop --help``.

Prompt format: the prompt, a newline, then the completion and EOS. Prompt tokens carry no loss
(label -100): the adapter learns answers, not questions.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from entroloop.training.dataset import Example

PROMPT_SUFFIX = "\n"
IGNORE = -100


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def folder_digest(folder: Path) -> str:
    """SHA-256 over (relative path, file SHA-256) of every file in ``folder``: names a base model."""
    folder = Path(folder)
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")):
        digest.update(f"{path.relative_to(folder).as_posix()}\x00{file_sha256(path)}\n".encode())
    return "sha256:" + digest.hexdigest()


def choose_dtype(precision: str) -> tuple[Any, str]:
    """(autocast dtype or None, name): bf16 where the hardware has it (``auto``), else fp32."""
    import torch

    if precision == "fp32":
        return None, "fp32"
    has_bf16 = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
    if precision == "bf16" or (precision == "auto" and has_bf16):
        return torch.bfloat16, "bf16"
    if precision != "auto":
        raise ValueError(f"precision must be auto, bf16 or fp32, not {precision!r}")
    return None, "fp32"


def device() -> Any:
    import torch

    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def load_tokenizer(base_model: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(base_model))


def load_base_model(base_model: Path) -> Any:
    """The base model in fp32 (master weights; bf16 happens through autocast), eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base_model), dtype=torch.float32)
    model.to(device())
    model.eval()
    return model


def prompt_ids(tokenizer: Any, prompt: str) -> list[int]:
    """The prompt's tokens exactly as vLLM's completions endpoint makes them (the tokenizer's own
    special tokens, e.g. a BOS, included), so training, the gate and serving see the same ids."""
    return tokenizer.encode(prompt + PROMPT_SUFFIX, add_special_tokens=True)


def completion_ids(tokenizer: Any, completion: str) -> list[int]:
    return tokenizer.encode(completion, add_special_tokens=False)


@dataclass(frozen=True)
class EncodedPair:
    input_ids: list[int]
    labels: list[int]


def encode_pair(tokenizer: Any, example: Example, max_len: int) -> EncodedPair:
    """Token ids and labels of one example; long prompts lose their start, never the answer."""
    p = prompt_ids(tokenizer, example.prompt)
    c = completion_ids(tokenizer, example.completion) + [tokenizer.eos_token_id]
    c = c[: max_len - 1]
    p = p[-(max_len - len(c)) :]
    return EncodedPair(p + c, [IGNORE] * len(p) + c)


@dataclass
class PackedRows:
    """Packed sequences: several examples per row, each attending only to itself."""

    input_ids: Any  # LongTensor [rows, seq_len]
    labels: Any  # LongTensor [rows, seq_len]
    position_ids: Any  # LongTensor [rows, seq_len], restarting at 0 for each example
    segments: Any  # LongTensor [rows, seq_len], example number within the row, -1 for padding

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    def batch(self, rows: Sequence[int], dtype: Any) -> dict[str, Any]:
        import torch

        idx = torch.as_tensor(list(rows), dtype=torch.long)
        return {
            "input_ids": self.input_ids[idx],
            "labels": self.labels[idx],
            "position_ids": self.position_ids[idx],
            "attention_mask": block_causal_mask(self.segments[idx], dtype),
        }


def pack(pairs: Sequence[EncodedPair], seq_len: int, pad_id: int) -> PackedRows:
    """First-fit-decreasing packing of whole examples into rows of ``seq_len`` tokens.

    Packing instead of padding each example to the longest keeps CPU/GPU time on real tokens; the
    block-diagonal mask and restarted positions keep examples from seeing each other.
    """
    import torch

    order = sorted(range(len(pairs)), key=lambda i: (-len(pairs[i].input_ids), i))
    rows: list[list[int]] = []
    room: list[int] = []
    for i in order:
        n = len(pairs[i].input_ids)
        slot = next((r for r, free in enumerate(room) if free >= n), None)
        if slot is None:
            rows.append([])
            room.append(seq_len)
            slot = len(rows) - 1
        rows[slot].append(i)
        room[slot] -= n
    shape = (len(rows), seq_len)
    input_ids = torch.full(shape, pad_id, dtype=torch.long)
    labels = torch.full(shape, IGNORE, dtype=torch.long)
    positions = torch.zeros(shape, dtype=torch.long)
    segments = torch.full(shape, -1, dtype=torch.long)
    for r, members in enumerate(rows):
        at = 0
        for s, i in enumerate(members):
            n = len(pairs[i].input_ids)
            input_ids[r, at : at + n] = torch.tensor(pairs[i].input_ids)
            labels[r, at : at + n] = torch.tensor(pairs[i].labels)
            positions[r, at : at + n] = torch.arange(n)
            segments[r, at : at + n] = s
            at += n
    return PackedRows(input_ids, labels, positions, segments)


def block_causal_mask(segments: Any, dtype: Any) -> Any:
    """Additive 4D mask [rows, 1, L, L]: token i sees token j iff same example and j <= i.

    Padding positions see only themselves (a fully masked row would give NaN in softmax; their
    labels are ignored anyway).
    """
    import torch

    seg_q = segments[:, :, None]
    seg_k = segments[:, None, :]
    length = segments.shape[1]
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    allowed = (seg_q == seg_k) & (seg_q >= 0) & causal
    allowed |= torch.eye(length, dtype=torch.bool)
    mask = torch.zeros(allowed.shape, dtype=dtype)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[:, None, :, :]


def mean_completion_loss(model: Any, tokenizer: Any, examples: Sequence[Example], seq_len: int,
                         autocast_dtype: Any = None, rows_per_batch: int = 16) -> float:
    """Mean cross-entropy per completion token (nats) over ``examples`` (perplexity = exp of it)."""
    import torch

    if not examples:
        return float("nan")
    pairs = [encode_pair(tokenizer, e, seq_len) for e in examples]
    packed = pack(pairs, seq_len, tokenizer.pad_token_id or 0)
    total, count = 0.0, 0
    dev = next(model.parameters()).device
    was_training = model.training
    model.eval()
    with torch.no_grad():
        for start in range(0, len(packed), rows_per_batch):
            batch = packed.batch(range(start, min(start + rows_per_batch, len(packed))),
                                 autocast_dtype or torch.float32)
            batch = {k: v.to(dev) for k, v in batch.items()}
            labels = batch.pop("labels")
            with torch.autocast(dev.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                logits = model(**batch).logits.float()
            shift_logits, shift_labels = logits[:, :-1], labels[:, 1:]
            loss = torch.nn.functional.cross_entropy(
                shift_logits.reshape(-1, shift_logits.shape[-1]), shift_labels.reshape(-1),
                ignore_index=IGNORE, reduction="sum",
            )
            total += float(loss)
            count += int((shift_labels != IGNORE).sum())
    model.train(was_training)
    return total / max(count, 1)


__all__ = [
    "EncodedPair", "PackedRows", "block_causal_mask", "choose_dtype", "completion_ids", "device",
    "encode_pair", "file_sha256", "folder_digest", "load_base_model", "load_tokenizer",
    "mean_completion_loss", "pack", "prompt_ids",
]
