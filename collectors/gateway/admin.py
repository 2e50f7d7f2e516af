"""The gateway's admin API: what alert runbooks (``streams/actions``) and operators change on live traffic.

``AuthMiddleware`` lets only an admin tenant's key reach ``/admin/...``. The endpoints (JSON bodies,
every field optional unless said):

* ``POST /admin/nodes/{node}/pause`` / ``resume`` and ``POST /admin/routes/{route}/pause`` / ``resume``
  (``{"duration_s": 300, "reason": ..., "alert_key": ...}``): while this gateway's node
  (``ENTROLOOP_NODE_ID``) or route (``ENTROLOOP_GATEWAY_ROUTE``) is paused, inference requests get
  503 with ``Retry-After`` and an OpenAI-style error. A pause of another node or route is kept and
  shown (``applies_here: false``) but changes nothing here: one gateway fronts one node and route.
* ``POST /admin/routes/{route}/tier`` (``{"tier": "primary" | "fallback", "duration_s": 600}``):
  ``fallback`` sends the route's upstream calls to ``ENTROLOOP_GATEWAY_FALLBACK_UPSTREAM`` (409 when
  it is not set); ``primary`` ends a forced fallback.
* ``POST /admin/adapters/{adapter}/unload``: asks the engine to unload the LoRA adapter (vLLM's
  ``/v1/unload_lora_adapter``) and stops routing to it; ``/rollback`` only stops routing to it;
  ``/restore`` undoes either for routing. Requests that would go to it (adapter routing, or a
  client naming it) go to its base model (``{"base": ...}`` in the body, else the engine's
  ``/v1/models`` parent).
* ``GET /admin/state``: all of the above, with the seconds each hold has left.

A hold with ``duration_s`` ends on its own (checked on every request; no timer to lose); without
one it lasts until resumed. Holds live in this process: a restarted gateway starts with none, which
is why runbooks give pauses a duration rather than rely on an operator's resume. A repeated
``Idempotency-Key`` on the same path (the action runner's retries) gets the first answer again without acting twice.
"""

from __future__ import annotations

import json
import logging
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from entroloop.infra.adapter_routing import AdapterRouting

log = logging.getLogger(__name__)

TIERS = ("primary", "fallback")
PRIMARY_ONLY = "entroloop_primary"  # httpx request extension: never redirect to the fallback tier
RETRY_AFTER_INDEFINITE_S = 60  # a hint for a pause without an end
IDEMPOTENCY_KEYS = 4096


@dataclass(frozen=True)
class Hold:
    """One pause, tier or adapter change: why, from which alert, until when (None: until undone)."""

    since: float
    until: float | None
    reason: str = ""
    alert_key: str = ""
    tenant: str = ""
    value: str = ""  # the tier, or the adapter's action (unload | rollback)
    base: str = ""  # an adapter's base model

    def left_s(self, now: float) -> float | None:
        return None if self.until is None else max(0.0, self.until - now)

    def as_dict(self, now: float) -> dict[str, Any]:
        out: dict[str, Any] = {"since": self.since, "until": self.until, "left_s": self.left_s(now),
                               "reason": self.reason, "alert_key": self.alert_key, "by": self.tenant}
        if self.value:
            out["value"] = self.value
        if self.base:
            out["base"] = self.base
        return out


class AdminState:
    """Holds by kind (``node``, ``route``, ``tier``, ``adapter``) and name; expired ones vanish on read."""

    KINDS = ("node", "route", "tier", "adapter")

    def __init__(self, clock: Callable[[], float] = time.time) -> None:
        self.clock = clock
        self._holds: dict[str, dict[str, Hold]] = {kind: {} for kind in self.KINDS}
        self._lock = threading.Lock()

    def set(self, kind: str, name: str, hold: Hold) -> None:
        with self._lock:
            self._holds[kind][name] = hold

    def clear(self, kind: str, name: str) -> bool:
        with self._lock:
            return self._holds[kind].pop(name, None) is not None

    def get(self, kind: str, name: str) -> Hold | None:
        with self._lock:
            hold = self._holds[kind].get(name)
            if hold is not None and hold.until is not None and hold.until <= self.clock():
                del self._holds[kind][name]  # expired: as if resumed
                return None
            return hold

    def snapshot(self) -> dict[str, dict[str, dict[str, Any]]]:
        now = self.clock()
        out: dict[str, dict[str, dict[str, Any]]] = {}
        for kind in self.KINDS:
            names = list(self._holds[kind])
            out[kind + "s"] = {name: hold.as_dict(now) for name in names if (hold := self.get(kind, name))}
        return out

    def tier(self, route: str) -> str:
        hold = self.get("tier", route)
        return hold.value if hold else "primary"

    def refusal(self, node: str, route: str) -> tuple[str, Hold] | None:
        """Why a request to this node and route must be refused now (None: serve it)."""
        for kind, name in (("node", node), ("route", route)):
            hold = self.get(kind, name)
            if hold is not None:
                return f"{kind} {name!r} is paused", hold
        return None


def openai_error(status: int, message: str, code: str, headers: dict[str, str] | None = None) -> JSONResponse:
    kind = {400: "invalid_request_error", 409: "conflict", 503: "service_unavailable"}.get(status, "api_error")
    return JSONResponse({"error": {"message": message, "type": kind, "param": None, "code": code}}, status, headers)


class PauseMiddleware:
    """ASGI middleware: inference requests get 503 (Retry-After) while this node or route is paused."""

    def __init__(self, app: ASGIApp, state: AdminState, node: str, route: str, paths: frozenset[str]) -> None:
        self.app, self.state, self.node, self.route, self.paths = app, state, node, route, paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] in self.paths:
            refused = self.state.refusal(self.node, self.route)
            if refused is not None:
                why, hold = refused
                left = hold.left_s(self.state.clock())
                retry = RETRY_AFTER_INDEFINITE_S if left is None else max(1, math.ceil(left))
                message = f"{why} by an operator or runbook ({hold.reason or 'no reason given'}); retry later"
                response = openai_error(503, message, why.split()[0] + "_paused", {"Retry-After": str(retry)})
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class TierRedirect:
    """An httpx request hook of the gateway's upstream client: while its route's tier is forced to
    ``fallback``, every upstream call goes to the fallback upstream instead. A hook, not a transport,
    so the URL is rewritten before httpx picks the transport (an environment proxy applies to the
    fallback as it would to the primary)."""

    def __init__(self, state: AdminState, route: str, primary: str, fallback: str) -> None:
        self.state, self.route = state, route
        self._primary_path = httpx.URL(primary).path.rstrip("/")
        self._fallback = httpx.URL(fallback) if fallback else None
        self.redirected = 0

    async def __call__(self, request: httpx.Request) -> None:
        if (self._fallback is None or request.extensions.get(PRIMARY_ONLY)
                or self.state.tier(self.route) != "fallback"):
            return
        rest = request.url.path.removeprefix(self._primary_path)
        url = self._fallback.copy_with(path=self._fallback.path.rstrip("/") + rest, query=request.url.query or None)
        request.url = url
        request.headers["Host"] = url.netloc.decode("ascii")
        self.redirected += 1


class AdminRouting:
    """Adapter routing (``routing.RoutingTable`` or none) minus the adapters unloaded or rolled back."""

    def __init__(self, state: AdminState, inner: Any | None) -> None:
        self.state, self.inner = state, inner

    def route(self, model: str, key: str) -> tuple[str, AdapterRouting | None]:
        served, routing = self.inner.route(model, key) if self.inner is not None else (model, None)
        hold = self.state.get("adapter", served)
        if hold is None:
            return served, routing
        if routing is not None:  # routed to a disabled adapter: its stable adapter if usable, else the base model
            stable = routing.served_stable
            return (stable if stable != served and self.state.get("adapter", stable) is None else routing.model), routing
        if hold.base:  # a client named the disabled adapter
            return hold.base, AdapterRouting(model=hold.base)
        return served, None


def _duration(body: dict[str, Any]) -> float | None:
    value = body.get("duration_s")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError("duration_s must be a positive number of seconds (or null: until resumed)")
    return float(value)


class AdminApi:
    """The ``/admin`` endpoints (see the module docstring) over one ``AdminState``."""

    def __init__(self, state: AdminState, gateway: Any, node: str, route: str, fallback_upstream: str) -> None:
        self.state, self.gateway, self.node, self.route = state, gateway, node, route
        self.fallback_upstream = fallback_upstream
        self._answers: OrderedDict[str, tuple[int, dict[str, Any]]] = OrderedDict()
        self._answers_lock = threading.Lock()

    def routes(self) -> list[Route]:
        post = ["POST"]
        return [
            Route("/admin/state", self.show, methods=["GET"]),
            Route("/admin/nodes/{name}/pause", self._handler(self.pause, "node"), methods=post),
            Route("/admin/nodes/{name}/resume", self._handler(self.resume, "node"), methods=post),
            Route("/admin/routes/{name}/pause", self._handler(self.pause, "route"), methods=post),
            Route("/admin/routes/{name}/resume", self._handler(self.resume, "route"), methods=post),
            Route("/admin/routes/{name}/tier", self._handler(self.tier, "tier"), methods=post),
            Route("/admin/adapters/{name}/unload", self._handler(self.unload, "adapter"), methods=post),
            Route("/admin/adapters/{name}/rollback", self._handler(self.rollback, "adapter"), methods=post),
            Route("/admin/adapters/{name}/restore", self._handler(self.resume, "adapter"), methods=post),
        ]

    async def show(self, _request: Request) -> JSONResponse:
        return JSONResponse({"node": self.node, "route": self.route, "fallback_upstream": bool(self.fallback_upstream),
                             "now": self.state.clock(), **self.state.snapshot()})

    def _handler(self, action: Callable[..., Any], kind: str) -> Callable[[Request], Any]:
        async def handle(request: Request) -> JSONResponse:
            # An idempotency key names one call of one endpoint: the same key on another path is
            # another call (a resume must not get the answer of the pause that used the key first).
            given = request.headers.get("idempotency-key", "")
            key = f"{request.url.path}\x1f{given}" if given else ""
            with self._answers_lock:
                earlier = self._answers.get(key) if key else None
            if earlier is not None:
                return JSONResponse({**earlier[1], "repeated": True}, earlier[0])
            try:
                raw = await request.body()
                body = json.loads(raw) if raw.strip() else {}
                if not isinstance(body, dict):
                    raise ValueError("the body must be a JSON object")  # noqa: TRY004 - a 400, like bad JSON
                status, answer = await action(kind, request.path_params["name"], body, request)
            except ValueError as exc:  # bad JSON or field (JSONDecodeError is a ValueError)
                return openai_error(400, str(exc), "invalid_admin_request")
            except RecursionError:  # json.loads on a body nested thousands of levels deep
                return openai_error(400, "the body is nested too deeply to be an admin request", "invalid_admin_request")
            if key and status < 500:  # a 5xx may be retried and succeed
                with self._answers_lock:
                    self._answers[key] = (status, answer)
                    while len(self._answers) > IDEMPOTENCY_KEYS:
                        self._answers.popitem(last=False)
            if status >= 400:
                return openai_error(status, answer["error"], answer.get("code", kind))
            log.warning("entroloop gateway admin: %s %s by %s: %s", request.url.path, json.dumps(body, sort_keys=True),
                        getattr(request.state, "tenant", "") or "?", answer)
            return JSONResponse(answer, status)

        return handle

    def _hold(self, body: dict[str, Any], request: Request, **extra: Any) -> Hold:
        now = self.state.clock()
        duration = _duration(body)
        return Hold(since=now, until=None if duration is None else now + duration, reason=str(body.get("reason", ""))[:500],
                    alert_key=str(body.get("alert_key", ""))[:200], tenant=str(getattr(request.state, "tenant", "") or ""),
                    **extra)

    def _applies(self, kind: str, name: str) -> bool:
        return name == {"node": self.node, "route": self.route, "tier": self.route}.get(kind, name)

    async def pause(self, kind: str, name: str, body: dict[str, Any], request: Request) -> tuple[int, dict[str, Any]]:
        hold = self._hold(body, request)
        self.state.set(kind, name, hold)
        return 200, {kind: name, "paused": True, "applies_here": self._applies(kind, name), **hold.as_dict(hold.since)}

    async def resume(self, kind: str, name: str, body: dict[str, Any], request: Request) -> tuple[int, dict[str, Any]]:
        return 200, {kind: name, "resumed": self.state.clear(kind, name), "applies_here": self._applies(kind, name)}

    async def tier(self, kind: str, name: str, body: dict[str, Any], request: Request) -> tuple[int, dict[str, Any]]:
        tier = body.get("tier")
        if tier not in TIERS:
            raise ValueError(f"tier must be one of {list(TIERS)}")
        if tier == "primary":
            self.state.clear("tier", name)
            return 200, {"route": name, "tier": "primary", "applies_here": self._applies(kind, name)}
        if not self.fallback_upstream:
            return 409, {"error": "no fallback tier configured: set ENTROLOOP_GATEWAY_FALLBACK_UPSTREAM to the fallback "
                                  "engine's base URL and restart the gateway", "code": "no_fallback_upstream"}
        hold = self._hold(body, request, value="fallback")
        self.state.set("tier", name, hold)
        return 200, {"route": name, "tier": "fallback", "applies_here": self._applies(kind, name), **hold.as_dict(hold.since)}

    async def _base_of(self, adapter: str, body: dict[str, Any]) -> str:
        base = body.get("base") or (await self.gateway.base_and_adapter(adapter))[0]
        return "" if base == adapter else str(base)

    async def rollback(self, kind: str, name: str, body: dict[str, Any], request: Request) -> tuple[int, dict[str, Any]]:
        hold = self._hold(body, request, value="rollback", base=await self._base_of(name, body))
        self.state.set("adapter", name, hold)
        return 200, {"adapter": name, "routed": False, **hold.as_dict(hold.since)}

    async def unload(self, kind: str, name: str, body: dict[str, Any], request: Request) -> tuple[int, dict[str, Any]]:
        hold = self._hold(body, request, value="unload", base=await self._base_of(name, body))
        self.state.set("adapter", name, hold)  # stop routing first: nothing new goes to it while it unloads
        key = self.gateway.config.upstream_api_key
        try:
            answer = await self.gateway.client.post(
                "/v1/unload_lora_adapter", json={"lora_name": name}, timeout=30.0,
                headers={"Authorization": f"Bearer {key}"} if key else {}, extensions={PRIMARY_ONLY: True},
            )
        except httpx.HTTPError as exc:
            return 502, {"error": f"routing to {name} stopped, but the engine could not be asked to unload it: "
                                  f"{type(exc).__name__}: {exc}", "code": "upstream_unreachable"}
        detail = answer.text[:500]
        if answer.status_code >= 500:
            return 502, {"error": f"routing to {name} stopped, but the engine answered {answer.status_code} to the "
                                  f"unload: {detail}", "code": "upstream_error"}
        # 404 / 400: not loaded there (already unloaded, or never): nothing left to unload
        return 200, {"adapter": name, "routed": False, "unloaded": answer.status_code == 200,
                     "upstream_status": answer.status_code, "upstream_response": detail, **hold.as_dict(hold.since)}


__all__ = ["PRIMARY_ONLY", "TIERS", "AdminApi", "AdminRouting", "AdminState", "Hold", "PauseMiddleware", "TierRedirect"]
