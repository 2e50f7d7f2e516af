"""Gateway hardening (issue 12, finding 7), each against the behaviour a hostile but fair user found:

* no authentication anywhere: admin paths such as /v1/load_lora_adapter were forwarded for anyone;
* no body limit: big bodies were read whole, small requests stalled behind them;
* audits over 1 MB became dead letters and never reached the audit log;
* an upstream dying mid-stream left no audit and no span;
* bad sampling parameters (``top_logprobs: "abc"``) gave a 500 with a traceback.

The gateway runs for real (Starlette, and uvicorn where sockets matter) in front of a fake engine
(``FakeUpstream``, real uvicorn) or a raw socket that breaks off its answer.
"""

from __future__ import annotations

import json
import logging
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from entroloop.collectors.gateway.app import GatewayConfig, create_app
from entroloop.collectors.gateway.auth import ApiKeys, GatewayConfigError, path_kind
from entroloop.sinks.audit.parquet_writer import AuditParquetWriter
from pydantic import SecretStr
from starlette.testclient import TestClient
from typer.testing import CliRunner

from entroloop.cli import app as cli_app
from entroloop.contract import codec
from entroloop.contract.records import Audit, Span
from entroloop.contract.settings import Settings
from entroloop.infra.pii import PiiRedactor
from entroloop.infra.worm.worm_store import LocalWormStore
from tests.unit.collectors.fake_openai_upstream import FakeUpstream
from tests.unit.collectors.served_app import ServedApp

ACME_KEY = "acme-0123456789abcdef-key"
OPS_KEY = "ops-fedcba9876543210-key"
KEYS = ApiKeys.parse_text(f"acme:{ACME_KEY},admin:{OPS_KEY}", "test")
CHAT = {"model": "base-m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
ADMIN_CALL = ("/v1/load_lora_adapter", {"lora_name": "evil", "lora_path": "/tmp/evil"})


class Recorder:
    """An httpx transport standing in for the engine, recording every request it gets."""

    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.url.path == "/v1/chat/completions":
            body = json.loads(request.content)
            text = f"echo: {body['messages'][-1]['content']}"
            return httpx.Response(200, json={"choices": [{"index": 0, "message": {"role": "assistant", "content": text}}],
                                             "usage": {"prompt_tokens": 1, "completion_tokens": 1}})
        return httpx.Response(200, json={"ok": True})

    def paths(self) -> list[str]:
        return [r.url.path for r in self.requests if r.url.path not in ("/version", "/v1/models", "/tokenizer_info")]


def _client(published: list, recorder: Recorder, **config: object) -> TestClient:
    gateway_config = GatewayConfig(upstream="http://engine", engine="vllm", node_id="gw-h", **config)  # type: ignore[arg-type]
    return TestClient(create_app(gateway_config, published.append, PiiRedactor(b"k"),
                                 transport=httpx.MockTransport(recorder)))


# --- (1) API keys per tenant -------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/admin/pause", "/sleep",
                                  "/reset_prefix_cache", "/collective_rpc", "/v1//load_lora_adapter",
                                  "/V1/load_lora_adapter", "/v1/feedback"])
def test_without_keys_admin_paths_are_refused_for_everyone_and_never_forwarded(path: str) -> None:
    recorder = Recorder()
    with _client([], recorder) as client:
        answer = client.post(path, json=ADMIN_CALL[1], headers={"Authorization": f"Bearer {OPS_KEY}"})
        completions = client.post("/v1/chat/completions", json=CHAT)  # inference stays open without keys
    assert answer.status_code == 403, answer.text
    assert "no API key configured" in answer.json()["error"]["message"]
    assert completions.status_code == 200
    assert recorder.paths() == ["/v1/chat/completions"]


def test_keys_are_required_checked_and_name_the_tenant_on_the_audit(caplog: pytest.LogCaptureFixture) -> None:
    recorder, published = Recorder(), []
    caplog.set_level(logging.DEBUG)
    with _client(published, recorder, api_keys=KEYS) as client:
        missing = client.post("/v1/chat/completions", json=CHAT)
        wrong = client.post("/v1/chat/completions", json=CHAT, headers={"Authorization": "Bearer not-a-key-at-all-xx"})
        bearer = client.post("/v1/chat/completions", json=CHAT,
                             headers={"Authorization": f"Bearer {ACME_KEY}", "X-Entroloop-Tenant": "other"})
        x_api_key = client.post("/v1/chat/completions", json=CHAT, headers={"X-API-Key": ACME_KEY})
        tenant_admin = client.post(ADMIN_CALL[0], json=ADMIN_CALL[1], headers={"X-API-Key": ACME_KEY})
        admin = client.post(ADMIN_CALL[0], json=ADMIN_CALL[1], headers={"Authorization": f"Bearer {OPS_KEY}"})
        feedback = client.post("/v1/feedback", json={"rating": 1})
        health = client.get("/health")
    assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
    assert wrong.status_code == 403 and "not valid" in wrong.json()["error"]["message"]
    assert bearer.status_code == 200 and x_api_key.status_code == 200
    assert tenant_admin.status_code == 403 and "may not use admin paths" in tenant_admin.json()["error"]["message"]
    assert admin.status_code == 200 and feedback.status_code == 401 and health.status_code == 200
    assert recorder.paths() == ["/v1/chat/completions", "/v1/chat/completions", ADMIN_CALL[0], "/health"]
    audits = [r for r in published if isinstance(r, Audit)]
    assert [a.tenant for a in audits] == ["acme", "acme"]  # the key's tenant; the header cannot claim another
    # the client's key is the gateway's: never forwarded, never logged, never in a record
    for request in recorder.requests:
        assert ACME_KEY not in str(request.headers) and OPS_KEY not in str(request.headers)
    assert ACME_KEY not in caplog.text and OPS_KEY not in caplog.text
    assert all(ACME_KEY.encode() not in codec.encode(r) for r in published)


def test_inference_can_stay_open_while_admin_needs_a_key() -> None:
    recorder = Recorder()
    with _client([], recorder, api_keys=KEYS, inference_auth="open") as client:
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
        assert client.post(ADMIN_CALL[0], json=ADMIN_CALL[1]).status_code == 401


def test_path_kinds_default_to_admin() -> None:
    assert path_kind("/v1/chat/completions") == "inference" and path_kind("/health") == "open"
    for path in ("/v1/load_lora_adapter", "/admin/anything", "/wake_up", "/v1/chat/completions/", "/unknown"):
        assert path_kind(path) == "admin", path


def test_key_settings_errors_name_the_setting_and_the_fix_and_never_the_key(tmp_path: Path) -> None:
    def error(**values: object) -> str:
        with pytest.raises(GatewayConfigError) as caught:
            GatewayConfig.from_settings(Settings(**values)).access_policy()  # type: ignore[arg-type]
        return str(caught.value)

    short = error(gateway_api_keys=SecretStr("acme:short-secret"))
    assert "ENTROLOOP_GATEWAY_API_KEYS" in short and "at least 16" in short and "short-secret" not in short
    assert "not `tenant:key`" in error(gateway_api_keys=SecretStr("just-a-long-key-without-tenant"))
    assert "own key" in error(gateway_api_keys=SecretStr(f"a:{ACME_KEY},b:{ACME_KEY}"))
    assert "ENTROLOOP_GATEWAY_API_KEYS_FILE" in error(gateway_api_keys_file=tmp_path / "missing")
    assert "ENTROLOOP_GATEWAY_INFERENCE_AUTH=required" in error(gateway_inference_auth="required")

    lines = tmp_path / "keys.txt"
    lines.write_text(f"# tenants\nacme:{ACME_KEY}\n\nadmin:{OPS_KEY}\n")
    as_json = tmp_path / "keys.json"
    as_json.write_text(json.dumps({"acme": [ACME_KEY], "admin": OPS_KEY}))
    for path in (lines, as_json):
        keys = GatewayConfig.from_settings(Settings(gateway_api_keys_file=path)).api_keys
        assert keys.tenant_of(ACME_KEY) == "acme" and keys.tenant_of(OPS_KEY) == "admin" and keys.tenant_of("x") is None
        assert ACME_KEY not in repr(keys)


# --- (2) body limit ----------------------------------------------------------------------------------
def test_bodies_over_the_limit_get_413_declared_or_streamed() -> None:
    recorder = Recorder()
    with _client([], recorder) as client:
        declared = client.post("/v1/chat/completions", content=b"x" * (3 << 20), headers={"Content-Type": "application/json"})
        streamed = client.post("/v1/embeddings", content=iter([b"y" * (1 << 20)] * 3))  # chunked: no Content-Length
        small = client.post("/v1/chat/completions", json=CHAT)
    assert declared.status_code == 413 and "ENTROLOOP_GATEWAY_MAX_BODY_BYTES" in declared.json()["error"]["message"]
    assert streamed.status_code == 413
    assert small.status_code == 200 and recorder.paths() == ["/v1/chat/completions"]


def test_ten_megabyte_bodies_are_refused_and_small_requests_are_not_stalled() -> None:
    published: list = []
    with FakeUpstream(vllm=True) as upstream:
        config = GatewayConfig(upstream=upstream.url, engine="vllm", node_id="gw-big")
        with ServedApp(create_app(config, published.append, PiiRedactor(b"k")), "gateway") as gateway:
            big = json.dumps({**CHAT, "messages": [{"role": "user", "content": "z" * (10 << 20)}]}).encode()

            def send_big(_: int) -> int:
                with httpx.Client(timeout=30) as client:
                    return client.post(f"{gateway.url}/v1/chat/completions", content=big,
                                       headers={"Content-Type": "application/json"}).status_code

            with ThreadPoolExecutor(8) as pool:
                statuses = pool.map(send_big, range(16))
                small_s = []
                with httpx.Client(timeout=30) as client:
                    for _ in range(10):
                        start = time.perf_counter()
                        assert client.post(f"{gateway.url}/v1/chat/completions", json=CHAT).status_code == 200
                        small_s.append(time.perf_counter() - start)
                statuses = list(statuses)
    assert statuses == [413] * 16
    assert max(small_s) < 2.0, small_s  # was 17 s behind 8 x 25 MB bodies
    assert not any(isinstance(r, Audit) and len(r.prompt) > 1000 for r in published)
    assert all(len(body["messages"][-1]["content"]) < 100 for _, body, _ in upstream.received if body)


# --- (3) large audits reach the audit log whole --------------------------------------------------------
def test_a_large_audit_is_published_in_parts_and_read_back_whole(tmp_path: Path) -> None:
    # ~1.4 MB of prompt, echoed back: a ~2.8 MB audit, with PII and multi-byte text across the cuts
    # (sparse PII: the redactor's cost grows with the number of entities, not what this test is about)
    unit = "订单 13812345678 请联系 alice@example.com thanks. " + "退货说明，请保留包装。" * 60
    content = unit * (1_400_000 // len(unit.encode()))
    body = {**CHAT, "messages": [{"role": "user", "content": content}]}
    published: list = []
    with FakeUpstream(vllm=True) as upstream:
        config = GatewayConfig(upstream=upstream.url, engine="vllm", node_id="gw-large")
        with TestClient(create_app(config, published.append, PiiRedactor(b"k"))) as client:
            assert client.post("/v1/chat/completions", json=body).status_code == 200
    parts = [r for r in published if isinstance(r, Audit)]
    assert len(parts) >= 3
    for part in parts:  # every part passes the consumers' record limit: none becomes a dead letter
        assert codec.decode(codec.encode(part)) == part
    assert {p.audit_id for p in parts} == {parts[0].audit_id} and len({p.event_id for p in parts}) == len(parts)
    assert [(p.part_index, p.part_count) for p in parts] == [(i, len(parts)) for i in range(len(parts))]
    prompt, response = "".join(p.prompt for p in parts), "".join(p.response for p in parts)
    assert "alice@example.com" not in prompt + response and "13812345678" not in prompt + response
    assert response.startswith("Hello there, 订单 [PHONE:") and len(response) > len(content)

    data_dir = tmp_path / "data"
    writer = AuditParquetWriter(LocalWormStore(data_dir / "worm"))
    writer.write(Audit.topic, 0, 0, len(parts) - 1, parts[::-1])  # order in the log does not matter
    writer.close()
    result = CliRunner().invoke(cli_app, ["audit", "get", "--audit-id", parts[0].audit_id, "--data-dir", str(data_dir)])
    assert result.exit_code == 0, result.output
    (line,) = result.stdout.splitlines()
    row = json.loads(line)
    assert row["prompt"] == prompt and row["response"] == response and row["part_count"] == len(parts)
    assert "parts_missing" not in row


def test_joining_parts_names_missing_ones_and_counts_a_redelivered_part_once() -> None:
    from entroloop.infra.worm.layouts import join_audit_parts

    def part(i: int, n: int = 3) -> dict:
        return {"audit_id": "a1", "prompt": f"p{i}", "response": f"r{i}", "part_index": i, "part_count": n, "_object": f"f{i}"}

    old = {"audit_id": "a0", "prompt": "p", "response": "r"}  # written before parts existed
    joined = join_audit_parts([old, part(2), part(0), part(2)])
    assert joined[0] is old
    assert (joined[1]["prompt"], joined[1]["response"], joined[1]["parts_missing"]) == ("p0p2", "r0r2", [1])
    assert joined[1]["_object"] == ["f0", "f2"]
    assert "parts_missing" not in join_audit_parts([part(1), part(0), part(2)])[0]


# --- (4) an upstream that dies mid-answer --------------------------------------------------------------
class BreakingEngine:
    """A raw HTTP engine that answers a POST with headers and a first piece, then drops the connection."""

    def __init__(self, stream: bool) -> None:
        self.stream = stream
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                head = b""
                while b"\r\n\r\n" not in head:
                    head += conn.recv(65536)
                header, _, rest = head.partition(b"\r\n\r\n")
                length = next((int(h.split(b":")[1]) for h in header.split(b"\r\n") if h.lower().startswith(b"content-length")), 0)
                while len(rest) < length:
                    rest += conn.recv(65536)
                if not header.startswith(b"POST"):
                    conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                elif self.stream:
                    event = b'data: {"choices":[{"index":0,"delta":{"content":"The answer is 4"}}]}\n\n'
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                                 + f"{len(event):x}\r\n".encode() + event + b"\r\n")
                else:
                    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 500\r\n\r\n{\"choi")
                time.sleep(0.05)
                conn.shutdown(socket.SHUT_RDWR)  # dies mid-answer

    def close(self) -> None:
        self.sock.close()


@pytest.fixture(params=[True, False], ids=["stream", "non-stream"])
def breaking_engine(request: pytest.FixtureRequest) -> Iterator[BreakingEngine]:
    engine = BreakingEngine(stream=request.param)
    yield engine
    engine.close()


def test_an_upstream_dying_mid_answer_still_yields_an_audit_and_a_span(breaking_engine: BreakingEngine) -> None:
    published: list = []
    config = GatewayConfig(upstream=breaking_engine.url, engine="vllm", node_id="gw-break", timeout_s=10)
    with TestClient(create_app(config, published.append, PiiRedactor(b"k"))) as client:
        answer = client.post("/v1/chat/completions", json={**CHAT, "stream": breaking_engine.stream},
                             headers={"X-Request-Id": "req-broken"})
    audits = [r for r in published if isinstance(r, Audit)]
    spans = [r for r in published if isinstance(r, Span)]
    assert len(audits) == 1 and len(spans) == 1, published
    (audit,), (span,) = audits, spans
    assert audit.outcome == "upstream_error" and audit.request_id == span.request_id == "req-broken"
    assert span.status == "error" and span.attributes["entroloop.outcome"] == "upstream_error"
    assert audit.prompt and "hello" in audit.prompt
    if breaking_engine.stream:
        assert answer.status_code == 200 and b"upstream_error" in answer.content  # the client is told
        assert audit.response == "The answer is 4"  # what had arrived
    else:
        assert answer.status_code == 502 and answer.json()["error"]["type"] == "gateway"


def test_a_client_leaving_mid_stream_still_yields_an_audit() -> None:
    """The engine keeps streaming after the client has gone: the audit says so and keeps what was sent."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)

    def slow_engine() -> None:
        while True:
            conn, _ = sock.accept()
            head = b""
            while b"\r\n\r\n" not in head:
                head += conn.recv(65536)
            if head.startswith(b"POST"):
                break
            conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            conn.close()
        with conn:
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n")
            for i in range(40):  # one event every 50 ms for 2 s
                event = f'data: {{"choices":[{{"index":0,"delta":{{"content":"w{i} "}}}}]}}\n\n'.encode()
                try:
                    conn.sendall(f"{len(event):x}\r\n".encode() + event + b"\r\n")
                except OSError:
                    return
                time.sleep(0.05)
            conn.sendall(b"0\r\n\r\n")

    threading.Thread(target=slow_engine, daemon=True).start()
    published: list = []
    config = GatewayConfig(upstream=f"http://127.0.0.1:{sock.getsockname()[1]}", engine="vllm", node_id="gw-left")
    try:
        with ServedApp(create_app(config, published.append, PiiRedactor(b"k")), "gateway") as gateway:
            with httpx.Client(timeout=10) as client, client.stream(
                    "POST", f"{gateway.url}/v1/chat/completions", json={**CHAT, "stream": True}) as answer:
                next(answer.iter_raw())  # the first event, then the client goes away
            deadline = time.time() + 10
            while not any(isinstance(r, Audit) for r in published):
                assert time.time() < deadline, "no audit after the client left"
                time.sleep(0.05)
    finally:
        sock.close()
    (audit,) = [r for r in published if isinstance(r, Audit)]
    assert audit.outcome == "client_disconnected" and audit.response.startswith("w0 ")
    assert [r.status for r in published if isinstance(r, Span)] == ["error"]


# --- (5) bad parameters: 400 with a message ------------------------------------------------------------
@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {**CHAT, "logprobs": True, "top_logprobs": "abc"}, "top_logprobs"),
    ("/v1/chat/completions", {**CHAT, "max_tokens": -5}, "max_tokens"),
    ("/v1/chat/completions", {**CHAT, "temperature": "hot"}, "temperature"),
    ("/v1/chat/completions", {**CHAT, "n": 0}, "n"),
    ("/v1/chat/completions", {**CHAT, "messages": "hello"}, "messages"),
    ("/v1/chat/completions", {**CHAT, "stream": "yes"}, "stream"),
    ("/v1/completions", {"model": "base-m", "prompt": "hi", "logprobs": "abc"}, "logprobs"),
    ("/v1/completions", {"model": "base-m", "prompt": "hi", "max_tokens": -1}, "max_tokens"),
    ("/v1/completions", {"model": "base-m"}, "prompt"),
    ("/v1/completions", [1, 2], None),
])
def test_bad_parameters_get_400_with_a_message_never_500(path: str, body: object, param: str | None) -> None:
    published: list = []
    with FakeUpstream() as upstream:
        config = GatewayConfig(upstream=upstream.url, engine="openai", node_id="gw-params")
        with TestClient(create_app(config, published.append, PiiRedactor(b"k")), raise_server_exceptions=False) as client:
            answer = client.post(path, json=body)
            not_json = client.post(path, content=b"{nope", headers={"Content-Type": "application/json"})
        assert upstream.received == []
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param
    assert (param or "JSON object") in error["message"] and "Traceback" not in answer.text
    assert not_json.status_code == 400 and "not valid JSON" in not_json.json()["error"]["message"]
    assert published == []
