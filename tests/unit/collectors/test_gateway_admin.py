"""The gateway's admin API (``collectors/gateway/admin.py``) on a real uvicorn-served gateway in front
of two real stub engines (primary and fallback tier): each endpoint changes what the next completion
does, only an admin tenant's key reaches it, and the action runner's runbook steps drive it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from entroloop.collectors.gateway.app import GatewayConfig, create_app
from entroloop.collectors.gateway.auth import ApiKeys
from entroloop.streams.actions import (
    ActionRunner,
    ActionState,
    WebhookClient,
    load_runbooks,
    parse_runbook,
)
from entroloop.streams.actions.runbooks import BUILTIN_RUNBOOKS_DIR
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from entroloop.contract.records import Action, Alert
from entroloop.infra.pii import PiiRedactor
from tests.unit.collectors.served_app import ServedApp

ACME_KEY = "acme-0123456789abcdef-key"
OPS_KEY = "ops-fedcba9876543210-key"
KEYS = ApiKeys.parse_text(f"acme:{ACME_KEY},admin:{OPS_KEY}", "test")
NODE, ROUTE, BASE, LORA = "node-1", "support", "base-m", "support-lora"


class Engine:
    """A stub vLLM-like engine: answers chat naming itself, lists a LoRA adapter, records unloads."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.chats: list[str] = []  # the model of each chat request received
        self.unloaded: list[str] = []
        app = Starlette(routes=[
            Route("/version", lambda r: JSONResponse({"version": "0.32.0"})),
            Route("/v1/models", lambda r: JSONResponse({"data": [{"id": BASE, "parent": None}, {"id": LORA, "parent": BASE}]})),
            Route("/v1/chat/completions", self.chat, methods=["POST"]),
            Route("/v1/unload_lora_adapter", self.unload, methods=["POST"]),
        ])
        self.served = ServedApp(app, f"{name} engine")

    async def chat(self, request: Request) -> JSONResponse:
        body = await request.json()
        self.chats.append(body["model"])
        return JSONResponse({"id": "c", "object": "chat.completion", "model": body["model"],
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": self.name}}]})

    async def unload(self, request: Request) -> JSONResponse:
        self.unloaded.append((await request.json())["lora_name"])
        return JSONResponse({"ok": True})


@pytest.fixture(scope="module")
def engines() -> Iterator[tuple[Engine, Engine]]:
    primary, fallback = Engine("primary"), Engine("fallback")
    with primary.served, fallback.served:
        yield primary, fallback


def _gateway(primary: Engine, fallback: Engine | None) -> Any:
    config = GatewayConfig(upstream=primary.served.url, node_id=NODE, route=ROUTE, api_keys=KEYS, engine="vllm",
                           fallback_upstream=fallback.served.url if fallback else "")
    return create_app(config, [].append, PiiRedactor(b"k"))


@pytest.fixture
def gateway(engines) -> Iterator[tuple[str, Any]]:
    app = _gateway(*engines)
    with ServedApp(app, "gateway") as served:
        yield served.url, app


def _chat(url: str, model: str = BASE) -> httpx.Response:
    return httpx.post(f"{url}/v1/chat/completions", headers={"Authorization": f"Bearer {ACME_KEY}"}, timeout=10,
                      json={"model": model, "messages": [{"role": "user", "content": "hi"}]})


def _admin(url: str, path: str, body: dict | None = None, key: str | None = OPS_KEY, **headers: str) -> httpx.Response:
    if key:
        headers["Authorization"] = f"Bearer {key}"
    return httpx.post(f"{url}{path}", json=body or {}, headers=headers, timeout=10)


def _served_by(response: httpx.Response) -> tuple[str, str]:
    assert response.status_code == 200, response.text
    data = response.json()
    return data["choices"][0]["message"]["content"], data["model"]


@pytest.mark.parametrize("path", ["/admin/state", f"/admin/nodes/{NODE}/pause", f"/admin/routes/{ROUTE}/tier"])
def test_admin_paths_need_an_admin_tenants_key(gateway, path):
    url, _ = gateway
    call = (lambda key: httpx.get(f"{url}{path}", headers={"Authorization": f"Bearer {key}"} if key else {})) \
        if path == "/admin/state" else (lambda key: _admin(url, path, {"tier": "fallback"}, key=key))
    assert call(None).status_code == 401
    assert call(ACME_KEY).status_code == 403
    assert call("not-a-key-0123456789").status_code == 403
    assert _served_by(_chat(url)) == ("primary", BASE)  # none of the refused calls changed anything


@pytest.mark.parametrize("kind,name", [("nodes", NODE), ("routes", ROUTE)])
def test_pause_answers_503_with_retry_after_until_resumed_or_expired(gateway, kind, name):
    url, app = gateway
    now = [1000.0]
    app.state.admin.clock = lambda: now[0]
    assert _served_by(_chat(url)) == ("primary", BASE)

    paused = _admin(url, f"/admin/{kind}/{name}/pause", {"duration_s": 300, "reason": "gibberish", "alert_key": "k1"})
    assert paused.status_code == 200 and paused.json()["applies_here"] is True
    refused = _chat(url)
    assert refused.status_code == 503 and refused.headers["Retry-After"] == "300"
    error = refused.json()["error"]
    assert error["type"] == "service_unavailable" and error["code"] == f"{kind[:-1]}_paused" and "gibberish" in error["message"]
    state = httpx.get(f"{url}/admin/state", headers={"Authorization": f"Bearer {OPS_KEY}"}).json()
    assert state[kind][name]["left_s"] == 300 and state[kind][name]["by"] == "admin"

    now[0] += 299.5
    assert _chat(url).headers["Retry-After"] == "1"
    now[0] += 1  # the pause has run out: served again, no resume needed
    assert _served_by(_chat(url)) == ("primary", BASE)

    _admin(url, f"/admin/{kind}/{name}/pause", {})  # no duration: until resumed
    assert _chat(url).status_code == 503
    assert _admin(url, f"/admin/{kind}/{name}/resume").json()["resumed"] is True
    assert _served_by(_chat(url)) == ("primary", BASE)


def test_pausing_another_node_or_route_changes_nothing_here(gateway):
    url, _ = gateway
    assert _admin(url, "/admin/nodes/node-9/pause", {"duration_s": 60}).json()["applies_here"] is False
    assert _admin(url, "/admin/routes/billing/pause", {"duration_s": 60}).json()["applies_here"] is False
    assert _served_by(_chat(url)) == ("primary", BASE)


def test_forced_fallback_tier_sends_requests_to_the_fallback_upstream_until_it_expires(gateway, engines):
    url, app = gateway
    now = [1000.0]
    app.state.admin.clock = lambda: now[0]
    assert _admin(url, f"/admin/routes/{ROUTE}/tier", {"tier": "fallback", "duration_s": 600}).status_code == 200
    assert _served_by(_chat(url)) == ("fallback", BASE)
    assert _served_by(_chat(url)) == ("fallback", BASE)
    assert _admin(url, f"/admin/routes/{ROUTE}/tier", {"tier": "primary"}).status_code == 200
    assert _served_by(_chat(url)) == ("primary", BASE)

    _admin(url, f"/admin/routes/{ROUTE}/tier", {"tier": "fallback", "duration_s": 600})
    assert _served_by(_chat(url))[0] == "fallback"
    now[0] += 601
    assert _served_by(_chat(url))[0] == "primary"


def test_fallback_tier_without_a_fallback_upstream_is_409_naming_the_setting(engines):
    with ServedApp(_gateway(engines[0], None), "gateway") as served:
        answer = _admin(served.url, f"/admin/routes/{ROUTE}/tier", {"tier": "fallback"})
        assert answer.status_code == 409 and "ENTROLOOP_GATEWAY_FALLBACK_UPSTREAM" in answer.json()["error"]["message"]
        assert _served_by(_chat(served.url))[0] == "primary"


@pytest.mark.parametrize("body", [{"tier": "gold"}, {"duration_s": -1}, {"duration_s": "soon"}])
def test_bad_admin_bodies_are_400(gateway, body):
    url, _ = gateway
    path = f"/admin/routes/{ROUTE}/tier" if "tier" in body else f"/admin/nodes/{NODE}/pause"
    answer = _admin(url, path, body)
    assert answer.status_code == 400 and answer.json()["error"]["type"] == "invalid_request_error"
    assert httpx.post(f"{url}/admin/nodes/{NODE}/pause", content=b"{not json", timeout=10,
                      headers={"Authorization": f"Bearer {OPS_KEY}"}).status_code == 400
    assert _served_by(_chat(url)) == ("primary", BASE)


def test_unload_asks_the_engine_and_routes_the_adapter_to_its_base_then_restore(gateway, engines):
    url, _ = gateway
    primary, _fallback = engines
    primary.unloaded.clear()
    assert _served_by(_chat(url, LORA)) == ("primary", LORA)
    answer = _admin(url, f"/admin/adapters/{LORA}/unload", {"reason": "entropy shift"})
    assert answer.status_code == 200 and answer.json()["unloaded"] is True and answer.json()["base"] == BASE
    assert primary.unloaded == [LORA]
    assert _served_by(_chat(url, LORA)) == ("primary", BASE)  # its requests go to the base model
    assert _admin(url, f"/admin/adapters/{LORA}/restore").json()["resumed"] is True
    assert _served_by(_chat(url, LORA)) == ("primary", LORA)


def test_rollback_routes_around_the_adapter_without_unloading_it(gateway, engines):
    url, _ = gateway
    primary, _fallback = engines
    primary.unloaded.clear()
    assert _admin(url, f"/admin/adapters/{LORA}/rollback", {}).json()["routed"] is False
    assert _served_by(_chat(url, LORA)) == ("primary", BASE)
    assert primary.unloaded == []


def test_a_repeated_idempotency_key_gets_the_first_answer_without_acting_again(gateway):
    url, _ = gateway
    first = _admin(url, f"/admin/nodes/{NODE}/pause", {"duration_s": 60}, **{"Idempotency-Key": "act-1"})
    _admin(url, f"/admin/nodes/{NODE}/resume")
    again = _admin(url, f"/admin/nodes/{NODE}/pause", {"duration_s": 60}, **{"Idempotency-Key": "act-1"})
    assert again.json()["repeated"] is True and again.json()["since"] == first.json()["since"]
    assert _served_by(_chat(url)) == ("primary", BASE)  # the repeat did not pause again


def test_an_idempotency_key_names_one_call_of_one_endpoint(gateway):
    url, _ = gateway
    paused = _admin(url, f"/admin/routes/{ROUTE}/pause", {"duration_s": 60}, **{"Idempotency-Key": "same-key"})
    resumed = _admin(url, f"/admin/routes/{ROUTE}/resume", {}, **{"Idempotency-Key": "same-key"})
    assert paused.json()["paused"] is True
    assert "repeated" not in resumed.json() and resumed.json()["resumed"] is True  # not the pause's answer
    assert _served_by(_chat(url)) == ("primary", BASE)  # the route really serves again


def test_a_body_nested_too_deep_is_a_400_not_a_500(gateway):
    url, _ = gateway
    answer = httpx.post(f"{url}/admin/nodes/{NODE}/pause", content=b"[" * 100_000 + b"]" * 100_000,
                        headers={"Authorization": f"Bearer {OPS_KEY}"}, timeout=10)
    assert answer.status_code == 400 and "nested" in answer.json()["error"]["message"]
    assert _served_by(_chat(url)) == ("primary", BASE)  # nothing paused


RUNBOOK_KINDS = """
name: every-gateway-step
version: 1
match: {rules: [gibberish]}
on_failure: continue
steps:
  - {kind: pause_route, duration_s: 120}
  - {kind: switch_fallback, duration_s: 120}
  - {kind: rollback_adapter, lora_name: "LORA"}
  - {kind: unload_adapter, lora_name: "LORA"}
  - {kind: pause_node, duration_s: 120}
""".replace("LORA", LORA)


def _alert(rule: str) -> Alert:
    return Alert(event_id=f"alert-{rule}", emitted_at=1000.0, node_id="worker", seq=1, request_id="req-1", trace_id="",
                 alert_key=f"{rule}:req-1", rule=rule, severity="critical", model=BASE, route=ROUTE,
                 subject_node=NODE, value=9.0, threshold=5.0)


def _runner(url: str, runbooks: list) -> ActionRunner:
    return ActionRunner(runbooks, ActionState(), endpoints={"gateway": url},
                        webhook=WebhookClient(attempts=1, token=OPS_KEY))


def test_action_runner_runbook_steps_hit_the_admin_api_and_change_live_routing(gateway, engines):
    url, _ = gateway
    primary, _fallback = engines
    primary.unloaded.clear()
    out = _runner(url, [parse_runbook(RUNBOOK_KINDS)]).process(_alert("gibberish"))
    actions = [r for r in out if isinstance(r, Action)]
    assert [(a.action, a.outcome) for a in actions] == [
        ("pause_route", "ok"), ("switch_fallback", "ok"), ("rollback_adapter", "ok"), ("unload_adapter", "ok"),
        ("pause_node", "ok")], [a.detail for a in actions]
    assert all(json.loads(a.detail)["status"] == 200 for a in actions)
    state = httpx.get(f"{url}/admin/state", headers={"Authorization": f"Bearer {OPS_KEY}"}).json()
    assert set(state["routes"]) == {ROUTE} and set(state["nodes"]) == {NODE} and set(state["adapters"]) == {LORA}
    assert state["tiers"][ROUTE]["value"] == "fallback" and state["tiers"][ROUTE]["alert_key"] == "gibberish:req-1"
    assert primary.unloaded == [LORA]
    assert _chat(url).status_code == 503


def test_packaged_fallback_runbook_switches_the_tier(gateway):
    url, _ = gateway
    runbooks = [r for r in load_runbooks(BUILTIN_RUNBOOKS_DIR) if r.name == "fallback-on-circuit-breaker"]
    out = _runner(url, runbooks).process(_alert("fallback_circuit_breaker"))
    assert [(a.action, a.outcome) for a in out] == [("switch_fallback", "ok")]
    assert _served_by(_chat(url))[0] == "fallback"


def test_the_action_runner_without_an_admin_key_is_refused_and_reports_it(gateway):
    url, _ = gateway
    runner = ActionRunner([parse_runbook(RUNBOOK_KINDS)], ActionState(), endpoints={"gateway": url},
                          webhook=WebhookClient(attempts=1, token=ACME_KEY))
    actions = runner.process(_alert("gibberish"))
    assert {a.outcome for a in actions} == {"failed"}
    assert {json.loads(a.detail)["status"] for a in actions} == {403}
    assert _served_by(_chat(url)) == ("primary", BASE)
