"""``X-Request-Id`` on every completion response, the gateway's own refusals included.

The outermost middleware: for the audited paths it takes the client's ``X-Request-Id`` (else a
UUIDv7), puts it in ``scope['state']['request_id']`` for the proxy's records, and sets it on the
response, whoever answers (the engine, the proxy, or the key / body-limit checks that run before
it), replacing any the engine sent. The client cites it in ``POST /v1/feedback``.
"""

from __future__ import annotations

import re
from collections.abc import Collection

from entroloop.collectors.gateway.feedback import MAX_ID_CHARS
from starlette.datastructures import Headers, MutableHeaders
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from entroloop.contract.ids import uuid7

HEADER_REQUEST_ID = "x-request-id"
# A client's id is kept only when POST /v1/feedback can cite it (at most MAX_ID_CHARS characters)
# and it is printable ASCII without spaces (it becomes a Kafka key and a log field); anything else
# is replaced, or the answer could never get feedback.
_CLIENT_ID = re.compile(rf"^[\x21-\x7e]{{1,{MAX_ID_CHARS}}}$")


class RequestIdMiddleware:
    """ASGI middleware giving each request on ``paths`` its request id, echoed in the response."""

    def __init__(self, app: ASGIApp, paths: Collection[str]) -> None:
        self.app = app
        self.paths = frozenset(paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] not in self.paths:
            await self.app(scope, receive, send)
            return
        given = Headers(scope=scope).get(HEADER_REQUEST_ID, "")
        request_id = given if _CLIENT_ID.match(given) else uuid7()
        scope.setdefault("state", {})["request_id"] = request_id

        async def send_with_id(message: Message) -> None:
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message)["X-Request-Id"] = request_id  # replaces the engine's
            await send(message)

        await self.app(scope, receive, send_with_id)


__all__ = ["HEADER_REQUEST_ID", "RequestIdMiddleware"]
