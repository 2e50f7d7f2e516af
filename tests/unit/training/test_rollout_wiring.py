"""The CLI's rollout step against a fake vLLM HTTP server: runtime LoRA calls, manifest-checked
files, canary metrics from chDB, and a canary that gets no traffic is abandoned and unloaded."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from entroloop.training.actions import ActionLog
from entroloop.training.publisher import VllmError, VllmLoraClient
from entroloop.training.registry import AdapterRegistry

from entroloop.contract.settings import Settings
from entroloop.infra.worm.worm_store import LocalWormStore


class FakeVllm(BaseHTTPRequestHandler):
    calls: list[tuple[str, dict]] = []
    loaded: set[str] = set()

    def log_message(self, *args) -> None:  # keep test output clean
        pass

    def _reply(self, code: int, body: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(body.encode())

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        FakeVllm.calls.append((self.path, body))
        if self.path == "/v1/load_lora_adapter":
            if not (Path(body["lora_path"]) / "adapter_config.json").exists():
                return self._reply(400, "no adapter there")
            FakeVllm.loaded.add(body["lora_name"])
            return self._reply(200, f"Success: LoRA adapter '{body['lora_name']}' added successfully.")
        if self.path == "/v1/unload_lora_adapter":
            if body["lora_name"] not in FakeVllm.loaded:
                return self._reply(404, "not loaded")
            FakeVllm.loaded.discard(body["lora_name"])
            return self._reply(200, "removed")
        self._reply(404, "no route")

    def do_GET(self) -> None:
        data = [{"id": "base"}] + [{"id": n} for n in sorted(FakeVllm.loaded)]
        self._reply(200, json.dumps({"data": data}))


@pytest.fixture
def fake_vllm():
    FakeVllm.calls, FakeVllm.loaded = [], set()
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeVllm)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_client_reports_http_errors(fake_vllm, tmp_path) -> None:
    client = VllmLoraClient(fake_vllm)
    with pytest.raises(VllmError, match="HTTP 400"):
        client.load("x", str(tmp_path))
    with pytest.raises(VllmError, match="HTTP 404"):
        client.unload("x")
    with pytest.raises(VllmError):
        VllmLoraClient("http://127.0.0.1:9", timeout=2).models()


def test_rollout_step_loads_checks_and_abandons_untrafficked_canary(fake_vllm, tmp_path, chdb_client, ch_database):
    from entroloop.cli.training import _rollout

    settings = Settings(data_dir=tmp_path, vllm_servers=[fake_vllm], base_model_name="base",
                        canary_stage_seconds=0.03, canary_checks_per_stage=3, canary_min_requests=5)
    actions = ActionLog()
    registry = AdapterRegistry(LocalWormStore(tmp_path / "adapters"), chdb_client, ch_database, actions)
    registry.ensure_schema()
    folder = tmp_path / "trained"
    folder.mkdir()
    (folder / "adapter_config.json").write_text("{}")
    (folder / "adapter_model.safetensors").write_bytes(b"w")
    adapter_id = registry.register(folder, model="m", base_model_digest="b", dataset_digest="d", metrics={}).adapter_id

    result = _rollout(settings, registry, actions)(adapter_id)

    assert result["outcome"] == "rolled_back" and "no canary traffic" in result["reason"]
    assert [c[0] for c in FakeVllm.calls] == ["/v1/load_lora_adapter", "/v1/unload_lora_adapter"]
    served = Path(FakeVllm.calls[0][1]["lora_path"])
    assert served.is_absolute() and (served / "adapter_model.safetensors").read_bytes() == b"w"
    assert FakeVllm.loaded == set()
    names = actions.names(adapter_id)
    assert names[:3] == ["adapter.registered", "adapter.loaded", "canary.stage"]
    assert names[-2:] == ["canary.rolled_back", "adapter.unloaded"] and names.count("canary.check") == 30
    assert registry.status(adapter_id) == "unloaded"
