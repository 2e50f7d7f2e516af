"""The request body limit: a body over ``ENTROLOOP_GATEWAY_MAX_BODY_BYTES`` gets 413, unread.

Without it eight 25 MB bodies held 1 GB in the gateway and stalled small requests for seconds: the
proxy read every body whole before looking at it. Two checks, both before the body is read whole:

* a declared ``Content-Length`` over the limit is refused at once (nothing is read);
* a body without one (chunked) is counted as it streams in, and refused as soon as the count
  passes the limit: at most one limit's worth of bytes is ever held.
"""

from __future__ import annotations

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyTooLarge(Exception):
    """Raised from ``receive`` when the streamed body passes the limit (caught by the middleware)."""


def too_large(limit: int) -> JSONResponse:
    message = f"request body over the gateway's limit of {limit} bytes (ENTROLOOP_GATEWAY_MAX_BODY_BYTES)"
    # Connection: close: the rest of the body is not read, so the connection cannot carry another request.
    return JSONResponse({"error": {"message": message, "type": "request_too_large"}}, 413,
                        headers={"Connection": "close"})


class BodyLimitMiddleware:
    """ASGI middleware enforcing the body limit on every HTTP request."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.refused = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = Headers(scope=scope).get("content-length")
        if declared is not None:
            if not declared.strip().isdigit():
                await JSONResponse({"error": {"message": "Content-Length is not a number", "type": "invalid_request_error"}},
                                   400, headers={"Connection": "close"})(scope, receive, send)
                return
            if int(declared) > self.max_bytes:
                self.refused += 1
                await too_large(self.max_bytes)(scope, receive, send)
                return
        received = 0
        started = False

        async def counted_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_bytes:
                    raise BodyTooLarge
            return message

        async def tracked_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counted_receive, tracked_send)
        except BodyTooLarge:
            self.refused += 1
            if started:  # the app answered before reading the body to the end: nothing more to say
                return
            await too_large(self.max_bytes)(scope, receive, send)


__all__ = ["BodyLimitMiddleware", "BodyTooLarge", "too_large"]
