"""The audit gateway's front door: an OpenAI-compatible proxy in front of vLLM or any
OpenAI-compatible engine, assembled from its parts.

Every request passes, in this order and before its body is read:

0. ``request_ids.RequestIdMiddleware``: completion requests get their request id (the client's
   ``X-Request-Id``, else a UUIDv7), returned in ``X-Request-Id`` on every response, refusals included;
1. ``auth.AuthMiddleware``: API keys per tenant; admin paths need an admin tenant's key and are
   refused when no key is configured; inference paths need a key when keys are configured;
2. ``admin.PauseMiddleware``: inference requests get 503 while an admin (or a runbook) paused this
   node or route;
3. ``limits.BodyLimitMiddleware``: a body over ``ENTROLOOP_GATEWAY_MAX_BODY_BYTES`` gets 413.

Then ``POST /v1/chat/completions`` and ``POST /v1/completions`` go to the audited proxy
(``completions.py``: parameter checks, correlation ids, approximate entropy, Audit/Span records) and
``POST /v1/feedback`` publishes a Feedback record (``feedback.py``), ``GET /metrics`` answers
entroloop's Prometheus metrics followed by the engine's (``metrics.py``), ``/admin/...`` is the
gateway's own admin API (``admin.py``: pauses, the fallback tier, adapter unload/rollback), and every
other path is forwarded unchanged (``passthrough.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from entroloop.collectors.gateway.admin import (
    AdminApi,
    AdminRouting,
    AdminState,
    PauseMiddleware,
    TierRedirect,
)
from entroloop.collectors.gateway.auth import (
    INFERENCE_PATHS,
    AuthMiddleware,
    GatewayConfigError,
)
from entroloop.collectors.gateway.completions import AUDITED_PATHS, Gateway, Publish
from entroloop.collectors.gateway.config import GatewayConfig
from entroloop.collectors.gateway.feedback import FEEDBACK_PATH, FeedbackEndpoint
from entroloop.collectors.gateway.limits import BodyLimitMiddleware
from entroloop.collectors.gateway.metrics import (
    MetricsEndpoint,
    RequestCounter,
    counted,
)
from entroloop.collectors.gateway.request_ids import RequestIdMiddleware
from entroloop.collectors.gateway.routing import RoutingTable
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Route

from entroloop.contract.settings import Settings
from entroloop.infra.pii import PiiRedactor, redactor_for_service

_METHODS = ["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]


def create_app(
    config: GatewayConfig,
    publish: Publish,
    redactor: PiiRedactor,
    transport: httpx.AsyncBaseTransport | None = None,
    routing: RoutingTable | None = None,
) -> Starlette:
    """The ASGI app (serve it with uvicorn); ``app.state.gateway`` is the Gateway.

    With ``routing`` the app refreshes it in the background while it runs (lifespan). Raises
    ``GatewayConfigError`` for a configuration that cannot work (e.g. keys required, none given)."""
    policy = config.access_policy()
    uncounted, publish = publish, counted(publish)
    admin = AdminState()
    # the admin API's live levers: a disabled adapter is routed around, a forced fallback tier
    # redirects upstream calls, a paused node or route is refused (PauseMiddleware below)
    gateway = Gateway(config, publish, redactor, transport, AdminRouting(admin, routing))  # type: ignore[arg-type]
    gateway.client.event_hooks["request"].append(
        TierRedirect(admin, config.route, config.upstream, config.fallback_upstream))

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        refresher = asyncio.create_task(routing.run()) if routing is not None else None
        try:
            yield
        finally:
            if refresher is not None:
                refresher.cancel()
            await gateway.aclose()

    routes = [Route(path, gateway.audited, methods=["POST"]) for path in AUDITED_PATHS]
    feedback = FeedbackEndpoint(publish, redactor, gateway.stamper, config.feedback_rate_per_min,
                                config.feedback_tenant_rate_per_min)
    routes.append(Route(FEEDBACK_PATH, feedback.handle, methods=["POST"]))
    routes.append(Route("/metrics", MetricsEndpoint(gateway.client).handle, methods=["GET"]))
    routes.extend(AdminApi(admin, gateway, config.node_id, config.route, config.fallback_upstream).routes())
    routes.append(Route("/{path:path}", gateway.proxy, methods=_METHODS))
    middleware = [  # the first listed runs first
        Middleware(RequestCounter, known_paths=frozenset({*AUDITED_PATHS, FEEDBACK_PATH, "/metrics"})),
        Middleware(RequestIdMiddleware, paths=AUDITED_PATHS),  # so refusals carry X-Request-Id too
        Middleware(AuthMiddleware, policy=policy),
        Middleware(PauseMiddleware, state=admin, node=config.node_id, route=config.route,
                   paths=INFERENCE_PATHS - {"/v1/models"}),
        Middleware(BodyLimitMiddleware, max_bytes=config.max_body_bytes),
    ]
    app = Starlette(routes=routes, middleware=middleware, lifespan=lifespan)
    app.state.gateway = gateway
    app.state.publish = uncounted  # the caller's publish (e.g. the node publisher's bound method, to close it)
    app.state.feedback = feedback
    app.state.admin = admin
    return app


def app_from_settings(settings: Settings, publish: Publish | None = None, **overrides: Any) -> Starlette:
    """The gateway as configured by ``ENTROLOOP_`` settings, publishing through the node publisher.

    Raises ``GatewayConfigError`` naming the setting and the fix when the keys cannot be used."""
    config = GatewayConfig.from_settings(settings, **overrides)
    # Before a publisher starts: ENTROLOOP_MODE=production without ENTROLOOP_PII_HASH_KEY raises
    # SettingsError naming the variable and the fix; the demo mode logs a loud warning.
    redactor = redactor_for_service(settings, "gateway")
    if publish is None:
        from entroloop.collectors.vllm.emit import resolve_sink

        publish = resolve_sink("publisher", settings)  # type: ignore[assignment]
    routing = RoutingTable.from_settings(settings) if config.adapter_routing else None
    return create_app(config, publish, redactor, routing=routing)


__all__ = ["AUDITED_PATHS", "Gateway", "GatewayConfig", "GatewayConfigError", "app_from_settings", "create_app"]
