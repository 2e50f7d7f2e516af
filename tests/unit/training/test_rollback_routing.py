"""`entroloop adapters rollback` changes routing: a promoted adapter hands its traffic back to the
parent it superseded (re-loaded into vLLM where a server lost it), else to the base model; a canary
is cut off. The routing state lives in the registry (ClickHouse), so any process sees the change."""

from __future__ import annotations

import json
import time
from pathlib import Path

from entroloop.training.actions import ActionLog
from entroloop.training.publisher import CanaryRouter
from entroloop.training.registry import AdapterRegistry

from entroloop.contract.settings import Settings
from entroloop.infra.worm.worm_store import LocalWormStore

from .test_rollout_wiring import FakeVllm, fake_vllm  # noqa: F401 - the fixture is used by name


def _register(registry: AdapterRegistry, folder: Path, n: int, parent: str = "") -> str:
    folder.mkdir()
    (folder / "adapter_config.json").write_text("{}")
    (folder / "adapter_model.safetensors").write_bytes(bytes([n]))
    return registry.register(folder, model="m", base_model_digest="b", dataset_digest=f"d{n}", metrics={},
                             parent=parent).adapter_id


def _status(registry: AdapterRegistry, adapter_id: str, status: str, share: float = 0.0) -> None:
    registry.set_status(adapter_id, status, share=share)
    time.sleep(0.01)  # the history is ordered by time (ms)


def _detail(actions: ActionLog, name: str, subject: str) -> dict:
    return json.loads([r for r in actions.records if r.action == name and r.alert_key == subject][-1].detail)


def test_rollback_routes_back_to_parent_then_base_and_cuts_canaries(fake_vllm, tmp_path, chdb_client,  # noqa: F811
                                                                    ch_database) -> None:
    from entroloop.cli.training import rollback_adapter

    settings = Settings(data_dir=tmp_path, vllm_servers=[fake_vllm], base_model_name="base",
                        adapter_store_dir=tmp_path / "adapters")
    actions = ActionLog()
    registry = AdapterRegistry(LocalWormStore(tmp_path / "adapters"), chdb_client, ch_database, actions)
    registry.ensure_schema()
    parent = _register(registry, tmp_path / "p", 1)
    child = _register(registry, tmp_path / "c", 2, parent=parent)
    _status(registry, parent, "promoted", 1.0)
    _status(registry, child, "promoted", 1.0)
    _status(registry, parent, "superseded")
    FakeVllm.loaded = {child}  # the server restarted since the parent was superseded: it must be re-loaded
    assert registry.routing("m") == {"model": "m", "stable": child, "canary": "", "share": 0.0}

    assert rollback_adapter(settings, registry, actions, child, "bad in production") == parent

    routing = registry.routing("m")
    assert routing == {"model": "m", "stable": parent, "canary": "", "share": 0.0}
    assert {CanaryRouter.from_routing("base", routing).choose(f"r{i}") for i in range(50)} == {parent}
    assert FakeVllm.loaded == {parent}
    loads = [body for path, body in FakeVllm.calls if path == "/v1/load_lora_adapter"]
    assert [b["lora_name"] for b in loads] == [parent]
    assert (Path(loads[0]["lora_path"]) / "adapter_model.safetensors").read_bytes() == bytes([1])
    assert registry.status(parent) == "promoted" and registry.status(child) == "unloaded"
    assert _detail(actions, "canary.rolled_back", child)["now_serving"] == parent
    assert _detail(actions, "adapter.restored", parent)["previous"] == child

    # the parent has no parent of its own: rolling it back routes to the base model
    assert rollback_adapter(settings, registry, actions, parent, "also bad") == "base"
    assert registry.routing("m")["stable"] == "" and FakeVllm.loaded == set()

    # a canary is cut off; the stable model is untouched
    canary = _register(registry, tmp_path / "k", 3)
    FakeVllm.loaded.add(canary)
    _status(registry, canary, "canary", 0.3)
    assert registry.routing("m") == {"model": "m", "stable": "", "canary": canary, "share": 0.3}
    assert rollback_adapter(settings, registry, actions, canary, "manual") == "base"
    assert registry.routing("m") == {"model": "m", "stable": "", "canary": "", "share": 0.0}
    assert FakeVllm.loaded == set() and _detail(actions, "canary.rolled_back", canary)["share_at_rollback"] == 0.3
