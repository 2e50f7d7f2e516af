"""Adapter registry against real chDB and the local write-once store (no torch)."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from entroloop.training.actions import ActionLog
from entroloop.training.registry import AdapterRegistry, ManifestMismatch

from entroloop.infra.worm.worm_store import LocalWormStore, ObjectExists


def _adapter(folder: Path, weights: bytes = b"\x00\x01weights") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text('{"r": 8, "lora_alpha": 16}')
    (folder / "adapter_model.safetensors").write_bytes(weights)
    return folder


@pytest.fixture
def registry(tmp_path, chdb_client, ch_database) -> AdapterRegistry:
    reg = AdapterRegistry(LocalWormStore(tmp_path / "store"), chdb_client, ch_database, ActionLog())
    reg.ensure_schema()
    return reg


def _register(registry: AdapterRegistry, folder: Path, parent: str = ""):
    return registry.register(folder, model="tiny-llama", base_model_digest="sha256:base",
                             dataset_digest="sha256:data", metrics={"pass_rate": 1.0},
                             parent=parent, trigger_key="k1")


def test_register_writes_manifest_with_every_file_digest(registry, tmp_path) -> None:
    manifest = _register(registry, _adapter(tmp_path / "a"))
    assert set(manifest.files) == {"adapter_config.json", "adapter_model.safetensors"}
    keys = registry.store.list(f"adapters/{manifest.adapter_id}/")
    assert f"adapters/{manifest.adapter_id}/manifest.json" in keys and len(keys) == 3
    stored = registry.store.root / "adapters" / manifest.adapter_id / "manifest.json"
    assert not stored.stat().st_mode & stat.S_IWUSR  # write-once: read-only on disk
    rows = registry.list()
    assert [(r["adapter_id"], r["status"]) for r in rows] == [(manifest.adapter_id, "candidate")]
    assert registry.actions.names(manifest.adapter_id) == ["adapter.registered"]


def test_retried_registration_is_idempotent_and_nothing_is_overwritten(registry, tmp_path) -> None:
    first = _register(registry, _adapter(tmp_path / "a"))
    again = _register(registry, _adapter(tmp_path / "a"))
    assert again.adapter_id == first.adapter_id and again.created_at == first.created_at
    assert registry.actions.records[-1].outcome == "already_registered"
    assert len(registry.list()) == 1
    with pytest.raises(ObjectExists):
        registry.store.put_once(f"adapters/{first.adapter_id}/manifest.json", b"{}")


def test_different_weights_or_parent_give_a_new_adapter(registry, tmp_path) -> None:
    a = _register(registry, _adapter(tmp_path / "a"))
    b = _register(registry, _adapter(tmp_path / "b", b"other"))
    c = _register(registry, _adapter(tmp_path / "a"), parent=a.adapter_id)
    assert len({a.adapter_id, b.adapter_id, c.adapter_id}) == 3
    assert c.parent_adapter == a.adapter_id


def test_fetch_checks_digests(registry, tmp_path) -> None:
    manifest = _register(registry, _adapter(tmp_path / "a"))
    out = registry.fetch(manifest.adapter_id, tmp_path / "out")
    assert (out / "adapter_model.safetensors").read_bytes() == b"\x00\x01weights"
    stored = registry.store.root / "adapters" / manifest.adapter_id / "files" / "adapter_model.safetensors"
    stored.chmod(0o644)
    stored.write_bytes(b"tampered")
    with pytest.raises(ManifestMismatch):
        registry.fetch(manifest.adapter_id, tmp_path / "out2")


def test_status_history_is_append_only(registry, tmp_path) -> None:
    manifest = _register(registry, _adapter(tmp_path / "a"))
    for status, share in [("loaded", 0.0), ("canary", 0.03), ("canary", 0.3), ("promoted", 1.0)]:
        registry.set_status(manifest.adapter_id, status, share=share)
    assert registry.status(manifest.adapter_id) == "promoted"
    assert [h[1] for h in registry.history(manifest.adapter_id)] == ["candidate", "loaded", "canary", "canary", "promoted"]
    assert registry.promoted("tiny-llama") == manifest.adapter_id
    with pytest.raises(ValueError):
        registry.set_status(manifest.adapter_id, "bogus")
