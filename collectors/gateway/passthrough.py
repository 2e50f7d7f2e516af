"""Forwarding what the gateway does not audit, and the headers it sends upstream.

Hop-by-hop and length headers are the proxy's own business, never forwarded. When the gateway
checks API keys, the client's key is the gateway's, not the engine's: it is taken out, and the
engine gets ``ENTROLOOP_GATEWAY_UPSTREAM_API_KEY`` instead (if set).
"""

from __future__ import annotations

import httpx
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

DROP_HEADERS = frozenset({"host", "content-length", "connection", "keep-alive", "transfer-encoding", "upgrade",
                          "accept-encoding"})
CREDENTIAL_HEADERS = frozenset({"authorization", "x-api-key"})


def upstream_headers(request: Request, strip_credentials: bool, upstream_key: str = "") -> dict[str, str]:
    """The client's headers as the engine should see them (no trace headers: the caller sets those)."""
    drop = DROP_HEADERS | {"traceparent", "tracestate"} | (CREDENTIAL_HEADERS if strip_credentials else set())
    headers = {k: v for k, v in request.headers.items() if k.lower() not in drop}
    if upstream_key:
        headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
        headers["Authorization"] = f"Bearer {upstream_key}"
    return headers


def unreachable(exc: httpx.HTTPError, background: BackgroundTask | None = None) -> JSONResponse:
    """502 naming the failure (the exception's text carries no request data)."""
    return JSONResponse({"error": {"message": f"upstream unreachable: {exc}", "type": "gateway"}}, 502,
                        background=background)


def relay(answer: httpx.Response, background: BackgroundTask | None = None) -> Response:
    """The engine's answer, as it came, to the client."""
    headers = {k: v for k, v in answer.headers.items() if k.lower() not in DROP_HEADERS | {"content-encoding", "content-type"}}
    return Response(answer.content, answer.status_code, headers=headers,
                    media_type=answer.headers.get("content-type"), background=background)


async def forward(client: httpx.AsyncClient, request: Request, headers: dict[str, str]) -> Response:
    """Any path the gateway does not audit (after the access check): forwarded as it is."""
    try:
        answer = await client.request(request.method, request.url.path, params=request.query_params,
                                      content=await request.body(), headers=headers)
    except httpx.HTTPError as exc:
        return unreachable(exc)
    return relay(answer)


__all__ = ["CREDENTIAL_HEADERS", "DROP_HEADERS", "forward", "relay", "unreachable", "upstream_headers"]
