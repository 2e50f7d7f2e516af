"""The gateway's ``GET /metrics``: entroloop's Prometheus metrics, then the engine's own.

vLLM serves its own Prometheus metrics (``vllm:*``: queue length, KV-cache use, TTFT histograms)
at ``/metrics``; the gateway sits in front of it, so its ``/metrics`` answers entroloop's metrics
(``entroloop_*``, see ``entroloop.infra.metrics``) followed by the engine's, fetched with a short
timeout: one scrape target per serving node gives both. Names cannot collide (``vllm:`` vs
``entroloop_``). An engine that does not answer only loses its part, reported as
``entroloop_upstream_metrics_up 0``.

``RequestCounter`` counts answered requests per route template (never the raw path: an adapter
name or id in a path must not create a time series per value).
"""

from __future__ import annotations

import httpx
from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, Gauge, generate_latest
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from entroloop.infra.metrics import EVENTS_OUT, HTTP_REQUESTS

UPSTREAM_UP = Gauge("entroloop_upstream_metrics_up", "1 if the engine's /metrics answered the last scrape, else 0.")
UPSTREAM_TIMEOUT_S = 2.0


class MetricsEndpoint:
    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def handle(self, _request: Request) -> Response:
        upstream = b""
        try:
            answer = await self.client.get("/metrics", timeout=UPSTREAM_TIMEOUT_S)
            if answer.status_code == 200:
                upstream = answer.content
        except httpx.HTTPError:
            pass
        UPSTREAM_UP.set(1 if upstream else 0)
        body = generate_latest(REGISTRY)
        if upstream:
            body += b"# the engine's own metrics (" + str(self.client.base_url).encode() + b"/metrics)\n" + upstream
        return Response(body, media_type=CONTENT_TYPE_LATEST)


def route_template(path: str, known: frozenset[str]) -> str:
    """A bounded label for ``path``: a known route as itself, ``/admin/...`` as ``/admin``, else ``other``."""
    if path in known:
        return path
    if path.startswith("/admin/"):
        return "/admin"
    return "other"


class RequestCounter:
    """ASGI middleware: ``entroloop_http_requests_total{path, status}`` per answered request."""

    def __init__(self, app: ASGIApp, known_paths: frozenset[str]) -> None:
        self.app = app
        self.known = known_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = route_template(scope["path"], self.known)

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                HTTP_REQUESTS.labels(path, str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counting_send)


def counted(publish, component: str = "gateway"):
    """``publish`` that also counts each record in ``entroloop_events_out_total{component, topic}``."""

    def publish_counted(record):
        result = publish(record)
        EVENTS_OUT.labels(component, type(record).topic).inc()
        return result

    return publish_counted


__all__ = ["MetricsEndpoint", "RequestCounter", "counted", "route_template"]
