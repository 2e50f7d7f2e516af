"""A real (tiny) causal language model, trained on CPU on real Chinese and English text.

Issue 14 item 3: the random-weight test models give ~flat entropies; a model that has learnt some
language gives the real thing — greedy decoding falls into loops, high temperature into gibberish.

The text: the gettext message catalogs (``/usr/share/locale/zh_CN/LC_MESSAGES/*.mo``) that Debian's
``coreutils`` and ``bash`` (both Essential) and ``git`` packages ship. Each catalog pairs every
English message (``msgid``: help texts, error messages) with its Simplified Chinese translation
(``msgstr``), written by people (GNU and git translation teams), so one set of files gives both
languages — about 0.47 M English and 0.24 M Chinese characters. The packages' licences are GPL
(``/usr/share/doc/<package>/copyright``; coreutils and bash GPL-3+, git GPL-2); the text is used
only to train a throw-away test model that is never distributed, and `provenance()` records the
exact package versions.

The model: a Llama (the architecture vLLM's CPU engine serves) with head size 64 (vLLM's CPU
attention rejects smaller heads), 3.0 M parameters, and a byte-level BPE tokenizer of 4096 tokens
trained on the same text; 600 steps reach ~3.4 nats of training loss. Training costs ~0.35 s a step
on 2 idle cores (~3.5 min), but it shares the cores: at load average 7-11 it took 43 min once. The
result is cached under ``~/.cache/entroloop/tiny-lm-<hash>`` where the hash covers the text, the
configuration and this file, so a repeat run (or the heavy test) loads it instantly.

Run ``python -m tests.corpora.tiny_lm`` (in .venv-ml) to train or find the cached model.
"""

from __future__ import annotations

import gettext
import hashlib
import json
import math
import os
import random
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

LOCALE_DIR = Path("/usr/share/locale/zh_CN/LC_MESSAGES")
# (Debian package, catalog file): Essential packages first, so the text is on every Debian machine.
CATALOGS = (("coreutils", "coreutils.mo"), ("bash", "bash.mo"), ("git", "git.mo"))
CACHE_ROOT = Path(
    os.environ.get("ENTROLOOP_CACHE_DIR", Path.home() / ".cache" / "entroloop")
)


@dataclass(frozen=True)
class TinyLMConfig:
    vocab_size: int = 4096
    hidden_size: int = 256
    intermediate_size: int = 512
    num_layers: int = 3
    num_heads: int = 4  # head size 64
    seq_len: int = 128
    batch_size: int = 24
    steps: int = 600
    lr: float = 3e-3
    warmup_steps: int = 30
    seed: int = 20261201
    threads: int = 2


@dataclass(frozen=True)
class Document:
    lang: str  # "en" or "zh"
    package: str
    text: str


def _clean(text: str) -> str:
    return "\n".join(line.rstrip() for line in text.strip().splitlines())


def corpus_documents(locale_dir: Path = LOCALE_DIR) -> list[Document]:
    """Every (English msgid, Chinese msgstr) pair of the catalogs, as two documents."""
    documents: list[Document] = []
    for package, filename in CATALOGS:
        path = locale_dir / filename
        if not path.exists():
            raise FileNotFoundError(
                f"{path} is missing: the tiny LM trains on the zh_CN catalog of Debian's '{package}' "
                f"package (apt-get install {package})"
            )
        with path.open("rb") as handle:
            catalog = gettext.GNUTranslations(
                handle
            )._catalog  # the stdlib parser keeps it there
        for key, translated in sorted(catalog.items(), key=lambda kv: str(kv[0])):
            english = key[0] if isinstance(key, tuple) else key
            if not english or not translated:  # "" is the catalog's header
                continue
            english, translated = _clean(english), _clean(translated)
            if len(english) >= 8:
                documents.append(Document("en", package, english))
            if len(translated) >= 4:
                documents.append(Document("zh", package, translated))
    return documents


def _package_version(package: str) -> str:
    try:
        return subprocess.run(
            ["dpkg-query", "-W", "-f=${Version}", package],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _package_licence(package: str) -> str:
    copyright_file = Path("/usr/share/doc") / package / "copyright"
    try:
        for line in copyright_file.read_text(errors="replace").splitlines():
            if line.startswith("License:"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return f"see /usr/share/doc/{package}/copyright"


def provenance(documents: list[Document] | None = None) -> dict:
    documents = corpus_documents() if documents is None else documents
    packages = {}
    for package, filename in CATALOGS:
        docs = [d for d in documents if d.package == package]
        packages[package] = {
            "version": _package_version(package),
            "licence": _package_licence(package),
            "file": str(LOCALE_DIR / filename),
            "en_chars": sum(len(d.text) for d in docs if d.lang == "en"),
            "zh_chars": sum(len(d.text) for d in docs if d.lang == "zh"),
        }
    return {
        "source": "Debian gettext catalogs (zh_CN), English msgid + Chinese msgstr",
        "packages": packages,
    }


def cache_key(documents: list[Document], config: TinyLMConfig) -> str:
    digest = hashlib.sha256()
    for document in documents:
        digest.update(f"{document.lang}\0{document.text}\0".encode())
    digest.update(json.dumps(asdict(config), sort_keys=True).encode())
    digest.update(Path(__file__).read_bytes())
    return digest.hexdigest()[:16]


def _log(message: str) -> None:
    print(f"[tiny-lm] {message}", file=sys.stderr, flush=True)


def train_tokenizer(documents: list[Document], config: TinyLMConfig):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=config.vocab_size,
        special_tokens=["<s>", "</s>", "<pad>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator((d.text for d in documents), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>"
    )


def _token_stream(documents: list[Document], tokenizer, seed: int) -> list[int]:
    """All documents, shuffled, each as <s> text </s>."""
    order = list(range(len(documents)))
    random.Random(seed).shuffle(order)
    encoded = tokenizer([documents[i].text for i in order], add_special_tokens=False)[
        "input_ids"
    ]
    stream: list[int] = []
    for ids in encoded:
        stream.append(tokenizer.bos_token_id)
        stream.extend(ids)
        stream.append(tokenizer.eos_token_id)
    return stream


def _train(folder: Path, documents: list[Document], config: TinyLMConfig) -> dict:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    started = time.monotonic()
    tokenizer = train_tokenizer(documents, config)
    tokenizer.save_pretrained(folder)
    stream = torch.tensor(
        _token_stream(documents, tokenizer, config.seed), dtype=torch.long
    )
    _log(
        f"tokenizer: {len(tokenizer)} tokens; corpus: {len(documents)} documents, {len(stream)} tokens "
        f"({time.monotonic() - started:.1f}s)"
    )

    model_config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_layers,
        num_attention_heads=config.num_heads,
        num_key_value_heads=config.num_heads,
        head_dim=config.hidden_size // config.num_heads,
        max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(model_config)
    parameters = sum(p.numel() for p in model.parameters())
    _log(
        f"model: {parameters / 1e6:.2f} M parameters; training {config.steps} steps of "
        f"{config.batch_size}x{config.seq_len} tokens on {config.threads} threads"
    )
    optimiser = torch.optim.AdamW(
        model.parameters(), lr=config.lr, weight_decay=0.01, betas=(0.9, 0.95)
    )

    def learning_rate(step: int) -> float:
        if step < config.warmup_steps:
            return config.lr * (step + 1) / config.warmup_steps
        progress = (step - config.warmup_steps) / max(
            1, config.steps - config.warmup_steps
        )
        return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    generator = torch.Generator().manual_seed(config.seed)
    model.train()
    losses: list[float] = []
    for step in range(config.steps):
        starts = torch.randint(
            0,
            len(stream) - config.seq_len - 1,
            (config.batch_size,),
            generator=generator,
        )
        batch = torch.stack(
            [stream[s : s + config.seq_len + 1] for s in starts.tolist()]
        )
        for group in optimiser.param_groups:
            group["lr"] = learning_rate(step)
        loss = model(
            input_ids=batch, labels=batch
        ).loss  # the model shifts labels by one itself
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimiser.step()
        losses.append(loss.item())
        if step % 25 == 0 or step == config.steps - 1:
            recent = sum(losses[-25:]) / len(losses[-25:])
            _log(
                f"step {step + 1}/{config.steps} loss {recent:.3f} nats ({time.monotonic() - started:.0f}s)"
            )
    model.eval()
    model.save_pretrained(folder, safe_serialization=True)
    return {
        "parameters": parameters,
        "corpus_tokens": len(stream),
        "documents": len(documents),
        "final_loss_nats": round(sum(losses[-25:]) / len(losses[-25:]), 4),
        "train_seconds": round(time.monotonic() - started, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def tiny_lm(
    config: TinyLMConfig = TinyLMConfig(), cache_root: Path = CACHE_ROOT
) -> Path:
    """The folder of the trained model (HF format, loadable by vLLM), training it if not cached."""
    documents = corpus_documents()
    folder = cache_root / f"tiny-lm-{cache_key(documents, config)}"
    if (folder / "training.json").exists():
        _log(f"cached: {folder}")
        return folder
    cache_root.mkdir(parents=True, exist_ok=True)
    staging = cache_root / f"{folder.name}.tmp-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        report = _train(staging, documents, config)
        report.update(config=asdict(config), provenance=provenance(documents))
        (staging / "training.json").write_text(
            json.dumps(report, indent=2, ensure_ascii=False)
        )
        try:
            staging.rename(
                folder
            )  # atomic: a half-trained folder is never taken for a cached one
        except OSError:  # another process finished first
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _log(
        f"trained in {report['train_seconds']}s, final loss {report['final_loss_nats']} nats: {folder}"
    )
    return folder


def training_report(folder: Path) -> dict:
    return json.loads((folder / "training.json").read_text())


if __name__ == "__main__":
    path = tiny_lm()
    print(path)
    print(json.dumps(training_report(path), indent=2, ensure_ascii=False))
