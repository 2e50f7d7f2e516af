"""`entroloop gateway` as a process: serves the OpenAI API, publishes through the node's default sink."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
from entroloop.collectors.vllm.emit import read_frames

from entroloop.contract.records import Audit, Span
from tests.unit.collectors.fake_openai_upstream import FakeUpstream


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_gateway_command_proxies_and_writes_audit_frames(tmp_path: Path) -> None:
    port = _free_port()
    env = {
        **os.environ,
        "ENTROLOOP_KAFKA_BOOTSTRAP": "",  # no broker: the default sink is a frame file in DATA_DIR
        "ENTROLOOP_DATA_DIR": str(tmp_path),
        "ENTROLOOP_NODE_ID": "gw-cli",
        "ENTROLOOP_PII_HASH_KEY": "k",
    }
    with FakeUpstream(vllm=True) as upstream:
        process = subprocess.Popen(
            [sys.executable, "-m", "entroloop.cli", "gateway", "--upstream", upstream.url, "--port", str(port),
             "--log-level", "warning"],
            env=env,
        )
        try:
            deadline = time.time() + 30
            while True:
                try:
                    httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=1)
                    break
                except httpx.HTTPError:
                    assert process.poll() is None, "gateway exited"
                    assert time.time() < deadline, "gateway did not start"
                    time.sleep(0.1)
            answer = httpx.post(
                f"http://127.0.0.1:{port}/v1/completions",
                json={"model": "base-m", "prompt": "call +1 (555) 123-4567", "user": "u1"},
            )
            assert answer.status_code == 200
            assert answer.json()["choices"][0]["text"] == "Hello there, call +1 (555) 123-4567"
            frames: list = []
            while time.time() < deadline and not any(isinstance(r, Audit) for r in frames):
                time.sleep(0.1)
                frames = [r for f in (tmp_path / "collectors").glob("*.bin") for r in read_frames(f)]
        finally:
            process.terminate()
            process.wait(timeout=10)
    audits = [r for r in frames if isinstance(r, Audit)]
    spans = [r for r in frames if isinstance(r, Span)]
    assert len(audits) == 1 and len(spans) == 1
    assert audits[0].node_id == "gw-cli" and audits[0].engine_version == "vllm 0.32.0"
    assert audits[0].redactions == {"phone": 2} and "555" not in audits[0].prompt
    assert audits[0].trace_id == spans[0].trace_id and audits[0].request_id == spans[0].request_id


def test_gateway_command_refuses_keys_that_cannot_work_naming_the_setting(monkeypatch, tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from entroloop.cli import app

    monkeypatch.setenv("ENTROLOOP_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("ENTROLOOP_GATEWAY_API_KEYS", "acme:tiny-secret")  # too short to be a key
    with socket.socket() as busy:  # code that ignored the keys would try to serve here, fail and exit 1
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = str(busy.getsockname()[1])
        result = CliRunner().invoke(app, ["gateway", "--upstream", "http://127.0.0.1:9", "--port", port])
    assert result.exit_code == 2, result.output
    assert "ENTROLOOP_GATEWAY_API_KEYS" in result.output and "at least 16" in result.output
    assert "tiny-secret" not in result.output and "Traceback" not in result.output
