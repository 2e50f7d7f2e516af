"""PEFT LoRA trainer: packed sequences, bf16 autocast where available, checkpoints, resume.

A plain PyTorch loop rather than ``transformers.Trainer``: the loop is short, and owning it keeps
what a checkpoint holds and how a resumed run continues explicit and testable:

* the data order of step ``s`` is a function of (seed, s) only (one permutation per epoch from a
  seeded generator), and the learning rate is a function of ``s`` only, so a run resumed from the
  checkpoint at step ``s`` takes exactly the steps an uninterrupted run would have taken;
* a checkpoint (adapter weights, optimizer state, step, loss history) is written to a temporary
  folder and renamed into place, so a crash mid-write leaves the previous checkpoint intact.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from entroloop.training.dataset import Example
from entroloop.training.modeling import (
    choose_dtype,
    device,
    encode_pair,
    load_base_model,
    load_tokenizer,
    pack,
)

CHECKPOINT_PREFIX = "step-"


@dataclass(frozen=True)
class TrainConfig:
    """LoRA and optimisation settings (defaults from the issue: r=8, alpha=16, q_proj+v_proj)."""

    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "v_proj")
    learning_rate: float = 2e-4
    max_steps: int = 200
    batch_rows: int = 8
    seq_len: int = 512
    checkpoint_every: int = 50
    keep_checkpoints: int = 2
    precision: str = "auto"
    seed: int = 0
    warmup_steps: int = 10
    weight_decay: float = 0.0
    # 0: torch's default. On a shared CPU, torch's default (one thread per core) spins against
    # other processes; 1 thread was 14x faster per step than 2 on a loaded 2-core test machine.
    cpu_threads: int = 0

    @classmethod
    def from_settings(cls, settings: Any, **overrides: Any) -> TrainConfig:
        values = dict(
            r=settings.lora_r, alpha=settings.lora_alpha, dropout=settings.lora_dropout,
            target_modules=tuple(settings.lora_target_modules), learning_rate=settings.train_learning_rate,
            max_steps=settings.train_max_steps, batch_rows=settings.train_batch_rows,
            seq_len=settings.train_seq_len, checkpoint_every=settings.train_checkpoint_every,
            precision=settings.train_precision, seed=settings.train_seed,
            cpu_threads=settings.train_cpu_threads,
        )
        values.update(overrides)
        return cls(**values)

    def lr_at(self, step: int) -> float:
        """Linear warmup, then cosine decay to 10% of the peak at ``max_steps``."""
        if step < self.warmup_steps:
            return self.learning_rate * (step + 1) / self.warmup_steps
        progress = (step - self.warmup_steps) / max(1, self.max_steps - self.warmup_steps)
        return self.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, progress))))


@dataclass
class TrainResult:
    adapter_dir: str
    steps: int
    resumed_from_step: int
    steps_run_now: int
    precision: str
    losses: list[float] = field(default_factory=list)
    train_rows: int = 0
    train_tokens: int = 0
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def latest_checkpoint(folder: Path) -> Path | None:
    """The newest complete checkpoint in ``folder`` (only complete ones are ever renamed in)."""
    if not folder.exists():
        return None
    steps = sorted(
        (int(p.name.removeprefix(CHECKPOINT_PREFIX)), p)
        for p in folder.iterdir()
        if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX) and (p / "meta.json").exists()
    )
    return steps[-1][1] if steps else None


class _Progress:
    """A rich progress bar on a terminal, one log line per checkpoint otherwise."""

    def __init__(self, total: int, start: int, enabled: bool) -> None:
        self._bar = None
        if enabled and sys.stderr.isatty():
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeRemainingColumn,
            )

            self._bar = Progress(TextColumn("LoRA"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("loss {task.fields[loss]:.4f}"), TimeRemainingColumn())
            self._task = self._bar.add_task("train", total=total, completed=start, loss=float("nan"))
            self._bar.start()

    def advance(self, loss: float) -> None:
        if self._bar is not None:
            self._bar.update(self._task, advance=1, loss=loss)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()


class LoraTrainer:
    """Trains one LoRA adapter on a base model folder; ``train`` resumes from ``work/checkpoints``."""

    def __init__(self, base_model: Path, config: TrainConfig, progress: bool = True,
                 on_step: Callable[[int, float], None] | None = None, init_adapter: Path | None = None) -> None:
        self.base_model = Path(base_model)
        # Incremental fine-tune: start from the parent adapter's weights when there is one.
        self.init_adapter = Path(init_adapter) if init_adapter else None
        self.config = config
        self.progress = progress
        self.on_step = on_step

    def _peft_model(self) -> Any:
        from peft import LoraConfig, PeftModel, get_peft_model

        base = load_base_model(self.base_model)
        if self.init_adapter is not None:
            return PeftModel.from_pretrained(base, str(self.init_adapter), is_trainable=True)
        lora = LoraConfig(
            r=self.config.r, lora_alpha=self.config.alpha, lora_dropout=self.config.dropout,
            target_modules=list(self.config.target_modules), bias="none", task_type="CAUSAL_LM",
        )
        return get_peft_model(base, lora)

    def train(self, examples: Sequence[Example], work: Path) -> TrainResult:
        """Train on ``examples``; write checkpoints to ``work/checkpoints``, the adapter to ``work/adapter``."""
        import torch
        from peft import get_peft_model_state_dict, set_peft_model_state_dict

        cfg = self.config
        started = time.monotonic()
        work = Path(work)
        ckpt_dir = work / "checkpoints"
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        autocast_dtype, precision = choose_dtype(cfg.precision)

        if cfg.cpu_threads and device().type == "cpu":
            torch.set_num_threads(cfg.cpu_threads)
        torch.manual_seed(cfg.seed)  # LoRA's A matrices are random: same seed, same start
        tokenizer = load_tokenizer(self.base_model)
        model = self._peft_model()
        dev = device()
        pairs = [encode_pair(tokenizer, e, cfg.seq_len) for e in examples]
        if not pairs:
            raise ValueError("no training examples")
        packed = pack(pairs, cfg.seq_len, tokenizer.pad_token_id or 0)
        params = [p for p in model.parameters() if p.requires_grad]
        optimizer = torch.optim.AdamW(params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay)

        step, losses = 0, []
        checkpoint = latest_checkpoint(ckpt_dir)
        if checkpoint is not None:
            meta = json.loads((checkpoint / "meta.json").read_text())
            set_peft_model_state_dict(model, torch.load(checkpoint / "adapter.pt", weights_only=True))
            optimizer.load_state_dict(torch.load(checkpoint / "optimizer.pt", weights_only=True))
            step, losses = int(meta["step"]), list(meta["losses"])
        resumed_from = step

        order = self._row_order(len(packed))
        progress = _Progress(cfg.max_steps, step, self.progress)
        model.train()
        try:
            while step < cfg.max_steps:
                rows = [order(step, i) for i in range(cfg.batch_rows)]
                # The additive mask in the compute dtype: SDPA rejects a float32 mask with bf16 queries.
                batch = {k: v.to(dev) for k, v in packed.batch(rows, autocast_dtype or torch.float32).items()}
                for group in optimizer.param_groups:
                    group["lr"] = cfg.lr_at(step)
                with torch.autocast(dev.type, dtype=autocast_dtype, enabled=autocast_dtype is not None):
                    loss = model(**batch).loss
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optimizer.step()
                step += 1
                losses.append(round(loss.item(), 6))
                progress.advance(losses[-1])
                if self.on_step is not None:
                    self.on_step(step, losses[-1])
                if step % cfg.checkpoint_every == 0 or step == cfg.max_steps:
                    self._save_checkpoint(ckpt_dir, step, losses, get_peft_model_state_dict(model), optimizer)
        finally:
            progress.close()

        adapter_dir = work / "adapter"
        tmp = work / f".adapter-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(str(tmp))
        shutil.rmtree(adapter_dir, ignore_errors=True)
        os.rename(tmp, adapter_dir)
        return TrainResult(
            adapter_dir=str(adapter_dir), steps=step, resumed_from_step=resumed_from,
            steps_run_now=step - resumed_from, precision=precision, losses=losses,
            train_rows=len(packed), train_tokens=int((packed.segments >= 0).sum()),
            seconds=round(time.monotonic() - started, 3),
        )

    def _row_order(self, n_rows: int) -> Callable[[int, int], int]:
        """Row of slot ``i`` of step ``s``: a pure function of (seed, s, i), so resume is exact."""
        import torch

        cache: dict[int, list[int]] = {}

        def permutation(epoch: int) -> list[int]:
            if epoch not in cache:
                gen = torch.Generator().manual_seed(self.config.seed * 1_000_003 + epoch)
                cache[epoch] = torch.randperm(n_rows, generator=gen).tolist()
            return cache[epoch]

        def row(step: int, slot: int) -> int:
            position = step * self.config.batch_rows + slot
            return permutation(position // n_rows)[position % n_rows]

        return row

    def _save_checkpoint(self, folder: Path, step: int, losses: list[float], adapter_state: dict, optimizer: Any) -> None:
        import torch

        final = folder / f"{CHECKPOINT_PREFIX}{step:08d}"
        if final.exists():
            return
        tmp = folder / f".tmp-{CHECKPOINT_PREFIX}{step:08d}-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        torch.save(adapter_state, tmp / "adapter.pt")
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        (tmp / "meta.json").write_text(json.dumps({"step": step, "losses": losses, "config": asdict(self.config)}))
        for name in os.listdir(tmp):
            with open(tmp / name, "rb") as fh:
                os.fsync(fh.fileno())
        os.rename(tmp, final)
        kept = sorted(p for p in folder.iterdir() if p.name.startswith(CHECKPOINT_PREFIX))
        for old in kept[: -self.config.keep_checkpoints]:
            shutil.rmtree(old, ignore_errors=True)


__all__ = ["LoraTrainer", "TrainConfig", "TrainResult", "latest_checkpoint"]
