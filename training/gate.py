"""Regression gate: an adapter is accepted only if it fixes the held-out bad cases and does not
make the model worse at accepted traffic.

Two measurements, each against the model the adapter would replace (its parent adapter, or the
base model when there is none):

* regression suite: held-out corrected bad cases, greedy decoding; a case passes when the answer
  equals the correction after normalization (case, width, whitespace, trailing punctuation), or
  starts with it at a word boundary (a model that states the corrected answer then keeps talking
  still gives it);
* general held-out loss: mean cross-entropy per completion token on held-out accepted traffic
  (perplexity = exp(loss)).

Accept iff pass rate rises by at least ``min_improvement``, reaches ``min_pass_rate``, and the
general loss rises by no more than ``loss_tolerance`` (relative). The decision is a pure function
(``decide``) so its boundaries are tested without torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from entroloop.training.dataset import Example, TrainingData, normalize_text


@dataclass(frozen=True)
class GateConfig:
    min_improvement: float = 0.1
    min_pass_rate: float = 0.5
    loss_tolerance: float = 0.05
    extra_tokens: int = 4
    seq_len: int = 512
    require_general_set: bool = True

    @classmethod
    def from_settings(cls, settings: Any, **overrides: Any) -> GateConfig:
        values = dict(
            min_improvement=settings.gate_min_improvement, min_pass_rate=settings.gate_min_pass_rate,
            loss_tolerance=settings.gate_loss_tolerance, seq_len=settings.train_seq_len,
            extra_tokens=settings.gate_extra_tokens,
        )
        values.update(overrides)
        return cls(**values)


@dataclass
class GateReport:
    accepted: bool
    reasons: list[str]
    suite_size: int
    general_size: int
    parent_pass_rate: float
    adapter_pass_rate: float
    parent_loss: float
    adapter_loss: float
    adapter_perplexity: float
    failures: list[dict[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def answer_matches(generated: str, correction: str) -> bool:
    """True when ``generated`` gives the corrected answer (exact or normalized, see module doc)."""
    got, want = normalize_text(generated), normalize_text(correction)
    if not want:
        return False
    return got == want or got.startswith(want + " ")


def decide(
    parent_pass_rate: float, adapter_pass_rate: float, parent_loss: float, adapter_loss: float,
    suite_size: int, general_size: int, config: GateConfig,
) -> tuple[bool, list[str]]:
    """The gate's verdict and every reason against it (empty when accepted)."""
    reasons = []
    if suite_size == 0:
        reasons.append("regression suite is empty: nothing shows the adapter fixes anything")
    elif adapter_pass_rate < parent_pass_rate + config.min_improvement:
        reasons.append(
            f"regression suite pass rate {adapter_pass_rate:.3f} did not improve on "
            f"{parent_pass_rate:.3f} by {config.min_improvement}"
        )
    if suite_size and adapter_pass_rate < config.min_pass_rate:
        reasons.append(f"regression suite pass rate {adapter_pass_rate:.3f} < minimum {config.min_pass_rate}")
    if general_size == 0:
        if config.require_general_set:
            reasons.append("general held-out set is empty: forgetting cannot be measured")
    elif not math.isfinite(adapter_loss) or adapter_loss > parent_loss * (1 + config.loss_tolerance):
        reasons.append(
            f"general held-out loss {adapter_loss:.4f} regressed beyond {config.loss_tolerance:.0%} "
            f"of {parent_loss:.4f}"
        )
    return not reasons, reasons


def pass_rate(model: Any, tokenizer: Any, suite: Sequence[Example], extra_tokens: int,
              failures: list[dict[str, str]] | None = None) -> float:
    """Share of ``suite`` whose greedy answer matches the correction."""
    import torch
    from entroloop.training.modeling import completion_ids, prompt_ids

    if not suite:
        return 0.0
    dev = next(model.parameters()).device
    model.eval()
    passed = 0
    with torch.no_grad():
        for example in suite:
            ids = torch.tensor([prompt_ids(tokenizer, example.prompt)], device=dev)
            budget = len(completion_ids(tokenizer, example.completion)) + extra_tokens
            out = model.generate(
                input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=budget,
                do_sample=False, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
            )
            answer = tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
            if answer_matches(answer, example.completion):
                passed += 1
            elif failures is not None and len(failures) < 5:
                failures.append({"prompt": example.prompt, "expected": example.completion, "got": answer})
    return passed / len(suite)


class RegressionGate:
    """Measures an adapter against its parent (or the base model) on a job's held-out data."""

    def __init__(self, base_model: Path, config: GateConfig) -> None:
        self.base_model = Path(base_model)
        self.config = config

    def _model(self, adapter_dir: Path | None) -> Any:
        from entroloop.training.modeling import load_base_model
        from peft import PeftModel

        base = load_base_model(self.base_model)
        if adapter_dir is None:
            return base
        return PeftModel.from_pretrained(base, str(adapter_dir))

    def evaluate(self, adapter_dir: Path, data: TrainingData, parent_adapter_dir: Path | None = None) -> GateReport:
        from entroloop.training.modeling import load_tokenizer, mean_completion_loss

        tokenizer = load_tokenizer(self.base_model)
        suite, general = data.regression_suite, data.general_heldout
        parent = self._model(parent_adapter_dir)
        parent_rate = pass_rate(parent, tokenizer, suite, self.config.extra_tokens)
        parent_loss = mean_completion_loss(parent, tokenizer, general, self.config.seq_len)
        del parent
        adapter = self._model(Path(adapter_dir))
        failures: list[dict[str, str]] = []
        adapter_rate = pass_rate(adapter, tokenizer, suite, self.config.extra_tokens, failures)
        adapter_loss = mean_completion_loss(adapter, tokenizer, general, self.config.seq_len)
        accepted, reasons = decide(parent_rate, adapter_rate, parent_loss, adapter_loss,
                                   len(suite), len(general), self.config)
        return GateReport(
            accepted=accepted, reasons=reasons, suite_size=len(suite), general_size=len(general),
            parent_pass_rate=round(parent_rate, 4), adapter_pass_rate=round(adapter_rate, 4),
            parent_loss=round(parent_loss, 6) if general else float("nan"),
            adapter_loss=round(adapter_loss, 6) if general else float("nan"),
            adapter_perplexity=round(math.exp(min(adapter_loss, 50.0)), 4) if general else float("nan"),
            failures=failures,
        )


__all__ = ["GateConfig", "GateReport", "RegressionGate", "answer_matches", "decide", "pass_rate"]
