"""The audited completions proxy: ``POST /v1/chat/completions`` and ``POST /v1/completions``.

For each request it

1. checks the body (``params.py``: 400 with a message for a bad parameter, never a 500);
2. starts its OpenTelemetry span as the child of the caller's W3C ``traceparent`` (or in a new
   trace; ``tracing.py``), takes an ``X-Request-Id`` (or makes one), and passes both on: a
   ``traceparent`` header naming the gateway's span as parent (vLLM's own tracing joins the trace)
   and, for vLLM, ``vllm_xargs.entroloop_request_id`` / ``entroloop_trace_id`` so the entropy tap's
   TokenEntropy records carry the same ids;
3. for engines that are not vLLM (no tap), asks for top-k logprobs and derives an approximate
   entropy per token (``TokenEntropy.approximate=True``), removing the logprobs from the answer
   when the client did not ask for them, so the client sees what the engine would have sent it;
4. after the answer has gone to the client, redacts PII from prompt and response and publishes an
   Audit record (in parts when large), ends the request's span (its Span record, and OTLP export
   when configured) and (non-vLLM) publishes the approximate TokenEntropy;
   an engine that fails mid-answer still yields them, with ``outcome="upstream_error"`` and what
   had arrived;
5. with adapter routing on (``ENTROLOOP_GATEWAY_ADAPTER_ROUTING``), rewrites a base model's name to
   its promoted or, for a sticky share of users, canary LoRA adapter (``routing.py``), and names
   that adapter in the Audit record and the Span.

Streaming (``"stream": true``) is relayed as it comes while the deltas are collected for the audit:
byte for byte from vLLM; from other engines each event carrying logprobs the client did not ask for
is re-serialised without them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
from entroloop.collectors.gateway import capture, passthrough
from entroloop.collectors.gateway.audit_records import build_records
from entroloop.collectors.gateway.config import GatewayConfig
from entroloop.collectors.gateway.exchange import Exchange
from entroloop.collectors.gateway.logprobs import (
    approximate_measures,
    approximate_token_hashes,
    restore_client_logprobs,
)
from entroloop.collectors.gateway.params import InvalidRequest, parse_body
from entroloop.collectors.gateway.routing import RoutingTable
from entroloop.collectors.gateway.streaming import StreamCollector, error_event
from entroloop.collectors.gateway.tracing import GatewayTracing
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse

from entroloop.contract.ids import NodeStamper, uuid7
from entroloop.contract.records import Event
from entroloop.infra.pii import PiiRedactor

log = logging.getLogger(__name__)

Publish = Callable[[Event], object]

AUDITED_PATHS = ("/v1/chat/completions", "/v1/completions")
HEADER_PROMPT_VERSION = "x-entroloop-prompt-version"
HEADER_TENANT = "x-entroloop-tenant"
HEADER_REQUEST_ID = "x-request-id"
ADAPTER_CACHE_S = 60.0
# Failures before the request reached the engine: nothing was answered, so there is nothing to audit.
_NOT_SENT = (httpx.ConnectError, httpx.ConnectTimeout, httpx.UnsupportedProtocol, httpx.LocalProtocolError)


class Gateway:
    """The proxy's state: upstream client, engine facts learnt once, record stamping."""

    def __init__(
        self,
        config: GatewayConfig,
        publish: Publish,
        redactor: PiiRedactor,
        transport: httpx.AsyncBaseTransport | None = None,
        routing: RoutingTable | None = None,
    ) -> None:
        self.config = config
        self.routing = routing
        self.publish = publish
        self.redactor = redactor
        self.stamper = NodeStamper(config.node_id)
        # the request spans: Span records through the same publish and stamper, OTLP when configured
        self.tracing = GatewayTracing(publish, self.stamper, config.route, config.otlp_endpoint)
        # identity: streamed bytes are relayed raw, so the engine must not compress them
        self.client = httpx.AsyncClient(
            base_url=config.upstream.rstrip("/"),
            timeout=config.timeout_s,
            transport=transport,
            headers={"Accept-Encoding": "identity"},
        )
        self._engine = None if config.engine == "auto" else config.engine
        self._engine_probed = False  # /version and /tokenizer_info asked once, also when the engine is named
        self._engine_version = config.engine_version
        self._tokenizer_digest = config.tokenizer_digest
        self._parents: dict[str, str | None] = {}  # served model id -> base model (LoRA) or None
        self._models_fetched_at = -ADAPTER_CACHE_S
        self._unserved_adapters: set[str] = set()
        self._record_errors = 0

    @property
    def publish_errors(self) -> int:
        """Records lost: Audit/TokenEntropy not built or not published, Span records not published."""
        return self._record_errors + self.tracing.records.errors

    # --- engine facts, asked once ------------------------------------------------------------
    async def engine(self) -> str:
        """``vllm`` when the upstream answers vLLM's ``/version``, else ``openai`` (asked once).

        A named engine (``--engine vllm``) skips the guess but not the facts the audit records need:
        the engine's version and tokenizer digest are still asked once."""
        if not self._engine_probed:
            self._engine_probed = True
            kind, version = "openai", ""
            try:
                answer = await self.client.get("/version", timeout=5.0, headers=self._engine_auth())
                if answer.status_code == 200 and "version" in answer.json():
                    kind, version = "vllm", f"vllm {answer.json()['version']}"
            except (httpx.HTTPError, ValueError, TypeError):
                pass
            self._engine = self._engine or kind
            self._engine_version = self._engine_version or version
            if self._engine == "vllm" and not self._tokenizer_digest:
                self._tokenizer_digest = await self._vllm_tokenizer_digest()
        return self._engine

    def _engine_auth(self) -> dict[str, str]:
        key = self.config.upstream_api_key
        return {"Authorization": f"Bearer {key}"} if key else {}

    async def _vllm_tokenizer_digest(self) -> str:
        """sha256 of vLLM's /tokenizer_info (served with --enable-tokenizer-info-endpoint), else ''."""
        try:
            answer = await self.client.get("/tokenizer_info", timeout=5.0, headers=self._engine_auth())
            if answer.status_code == 200:
                canonical = json.dumps(answer.json(), sort_keys=True, separators=(",", ":")).encode()
                return "sha256:" + hashlib.sha256(canonical).hexdigest()
        except (httpx.HTTPError, ValueError):
            pass
        return ""

    async def base_and_adapter(self, model: str) -> tuple[str, str]:
        """(base model, LoRA adapter) of a served model name, from /v1/models ``parent`` (vLLM)."""
        if model not in self._parents and time.monotonic() - self._models_fetched_at > ADAPTER_CACHE_S:
            self._models_fetched_at = time.monotonic()
            try:
                answer = await self.client.get("/v1/models", timeout=5.0, headers=self._engine_auth())
                for card in answer.json().get("data", []):
                    self._parents[card["id"]] = card.get("parent")
            except (httpx.HTTPError, ValueError, KeyError, AttributeError, TypeError):
                pass
        parent = self._parents.get(model)
        return (parent, model) if parent else (model, "")

    # --- request path ------------------------------------------------------------------------
    def _upstream_headers(self, request: Request) -> dict[str, str]:
        return passthrough.upstream_headers(request, strip_credentials=bool(self.config.api_keys),
                                            upstream_key=self.config.upstream_api_key)

    async def proxy(self, request: Request) -> Response:
        """Any other path (the access rule has already let it through): forwarded as it is."""
        return await passthrough.forward(self.client, request, self._upstream_headers(request))

    def _tenant(self, request: Request, headers: dict[str, str]) -> str:
        """The API key's tenant; without keys configured, the (unverified) X-Entroloop-Tenant header."""
        if self.config.api_keys:
            return str(getattr(request.state, "tenant", "") or "")
        return headers.get(HEADER_TENANT, "")

    async def audited(self, request: Request) -> Response:
        """Chat and text completions: forward with correlation ids, then audit.

        Every answer (streamed or not, the engine's errors and the gateway's own) carries
        ``X-Request-Id``: the id its records use, which a client cites in ``POST /v1/feedback``."""
        # RequestIdMiddleware chose the id (and sets the response header); called without it, as here.
        request_id = getattr(request.state, "request_id", None) or request.headers.get(HEADER_REQUEST_ID) or uuid7()
        response = await self._audited(request, request_id)
        response.headers["X-Request-Id"] = request_id  # replaces any the engine sent
        return response

    async def _audited(self, request: Request, request_id: str) -> Response:
        try:
            body = parse_body(await request.body(), request.url.path)
        except InvalidRequest as exc:
            return JSONResponse(exc.as_openai_error(), 400)
        headers = {k.lower(): v for k, v in request.headers.items()}
        engine = await self.engine()
        start = time.time()
        exchange = Exchange(
            path=request.url.path,
            body=body,
            headers=headers,
            span=self.tracing.start(request.url.path, headers, start, request_id),
            request_id=request_id,
            engine=engine,
            start=start,
            tenant=self._tenant(request, headers),
        )
        body = exchange.body = self._route(exchange)
        if not exchange.routed:
            exchange.model, exchange.adapter = await self.base_and_adapter(str(body.get("model", "")))
        upstream_headers = self._upstream_headers(request)
        self.tracing.inject(exchange.span, upstream_headers)
        # vLLM names the request after X-Request-Id (prefixed cmpl-/chatcmpl-), so its own span
        # (gen_ai.request.id) carries the gateway's request id too.
        upstream_headers = {k: v for k, v in upstream_headers.items() if k.lower() != HEADER_REQUEST_ID}
        upstream_headers["X-Request-Id"] = exchange.request_id
        upstream_body, client_logprobs = self._upstream_body(exchange)
        if body.get("stream"):
            return await self._stream(exchange, upstream_body, upstream_headers, client_logprobs)

        try:
            answer = await self.client.post(exchange.path, json=upstream_body, headers=upstream_headers)
            if answer.status_code == 404 and exchange.routed and exchange.adapter:
                # The engine does not serve the routed adapter (not loaded there): serve the base model.
                body = exchange.body = self._unroute(exchange)
                upstream_body, client_logprobs = self._upstream_body(exchange)
                answer = await self.client.post(exchange.path, json=upstream_body, headers=upstream_headers)
            if answer.status_code == 400 and upstream_body is not body and exchange.engine != "vllm":
                # The engine refused what we added (e.g. top_logprobs over its limit): serve without it.
                upstream_body, client_logprobs = body, None
                answer = await self.client.post(exchange.path, json=body, headers=upstream_headers)
        except httpx.HTTPError as exc:
            exchange.end, exchange.status_code = time.time(), 502
            if not isinstance(exc, _NOT_SENT):  # the engine had the request and failed while answering
                exchange.outcome, exchange.error = "upstream_error", f"{type(exc).__name__}: {exc}"
            return passthrough.unreachable(exc, BackgroundTask(self._record, exchange))
        exchange.end, exchange.status_code = time.time(), answer.status_code
        try:
            data = answer.json() if answer.status_code == 200 else None
        except ValueError:
            data = None
        if not isinstance(data, dict):
            return passthrough.relay(answer, BackgroundTask(self._record, exchange))
        exchange.response = data
        if upstream_body is body or exchange.engine == "vllm":
            return passthrough.relay(answer, BackgroundTask(self._record, exchange))  # byte for byte
        exchange.entropies, exchange.surprisals = approximate_measures(exchange.path, data)
        exchange.token_hashes = approximate_token_hashes(exchange.path, data)
        restore_client_logprobs(exchange.path, data, client_logprobs)
        return JSONResponse(data, answer.status_code, background=BackgroundTask(self._record, exchange))

    def _route(self, exchange: Exchange) -> dict[str, Any]:
        """The client's body with ``model`` rewritten by adapter routing (the body itself when the
        routing leaves it alone). Sticky per user (``user`` / ``X-User-Id``), else per request id."""
        requested = exchange.body.get("model")
        if self.routing is None or not isinstance(requested, str) or not requested:
            return exchange.body
        key = capture.user_of(exchange.body, exchange.headers) or exchange.request_id
        try:
            served, routing = self.routing.route(requested, key)
        except Exception:
            log.exception("entroloop gateway: adapter routing failed for %s; serving it as named", requested)
            return exchange.body
        if routing is None:
            return exchange.body
        exchange.model = routing.model
        exchange.adapter = "" if served == routing.model else served
        exchange.routed = "canary" if routing.canary and served == routing.canary else "stable"
        return exchange.body if served == requested else {**exchange.body, "model": served}

    def _unroute(self, exchange: Exchange) -> dict[str, Any]:
        """Back to the base model the client named, after the engine refused the routed adapter."""
        if exchange.adapter not in self._unserved_adapters:  # once per adapter, not per request
            self._unserved_adapters.add(exchange.adapter)
            log.warning("entroloop gateway: upstream answers 404 for routed adapter %s; its requests go to %s",
                        exchange.adapter, exchange.model)
        exchange.adapter, exchange.routed = "", "stable"
        return {**exchange.body, "model": exchange.model}

    def _upstream_body(self, exchange: Exchange) -> tuple[dict[str, Any], Any]:
        """The body sent upstream, and what the client asked for in logprobs (to give back only that).

        The body has passed ``params.parse_body``, so the numbers read here are numbers."""
        body = exchange.body
        if exchange.engine == "vllm":
            # The tap's keys are the gateway's to set: a client's own (an opt-out of measurement,
            # someone else's request id) are dropped, whatever the client meant by them.
            xargs = {key: value for key, value in (body.get("vllm_xargs") or {}).items()
                     if not str(key).startswith("entroloop_")}
            xargs.update(entroloop_request_id=exchange.request_id, entroloop_trace_id=exchange.trace_id,
                         entroloop_route=self.config.route)
            return {**body, "vllm_xargs": xargs}, None
        k = self.config.top_logprobs
        if exchange.path.endswith("chat/completions"):
            asked = int(body.get("top_logprobs") or 0) if body.get("logprobs") else None
            return {**body, "logprobs": True, "top_logprobs": max(k, asked or 0)}, asked
        asked = body.get("logprobs")
        asked = int(asked) if isinstance(asked, int) and not isinstance(asked, bool) else None
        return {**body, "logprobs": max(k, asked or 0)}, asked

    async def _stream(
        self, exchange: Exchange, upstream_body: dict[str, Any], headers: dict[str, str], client_logprobs: int | None
    ) -> Response:
        """Relay the SSE stream, collecting the deltas for the audit.

        vLLM's stream goes through byte for byte. From another engine the logprobs the gateway
        added are taken out of each event (re-serialised) after their entropies are read. The
        records are published when the stream ends however it ends: done, the engine failing
        mid-stream (the client then gets an SSE error event), or the client leaving.
        """
        injected = upstream_body is not exchange.body and exchange.engine != "vllm"
        try:
            answer = await self.client.send(
                self.client.build_request("POST", exchange.path, json=upstream_body, headers=headers), stream=True
            )
            if answer.status_code == 404 and exchange.routed and exchange.adapter:
                await answer.aclose()  # the routed adapter is not served there: serve the base model
                exchange.body = self._unroute(exchange)
                upstream_body, client_logprobs = self._upstream_body(exchange)
                answer = await self.client.send(
                    self.client.build_request("POST", exchange.path, json=upstream_body, headers=headers), stream=True
                )
            if answer.status_code == 400 and injected:
                await answer.aclose()  # refused what we added: serve the client's own request
                injected, client_logprobs = False, None
                answer = await self.client.send(
                    self.client.build_request("POST", exchange.path, json=exchange.body, headers=headers), stream=True
                )
        except httpx.HTTPError as exc:
            exchange.end, exchange.status_code = time.time(), 502
            if not isinstance(exc, _NOT_SENT):
                exchange.outcome, exchange.error = "upstream_error", f"{type(exc).__name__}: {exc}"
            return passthrough.unreachable(exc, BackgroundTask(self._record, exchange))
        exchange.status_code = answer.status_code
        collector = StreamCollector(exchange, rewrite=injected and answer.status_code == 200, asked=client_logprobs)

        def finish() -> None:
            exchange.end = time.time()
            exchange.response = collector.as_response()
            exchange.entropies = collector.entropies
            exchange.token_hashes = collector.token_hashes
            exchange.surprisals = collector.surprisals

        async def relay() -> AsyncIterator[bytes]:
            finished = False  # True once nothing more is sent to the client
            try:
                try:
                    async for chunk in answer.aiter_raw():
                        out = collector.feed(chunk)
                        if out:
                            yield out
                    rest = collector.flush()
                    if rest:
                        yield rest
                except httpx.HTTPError as exc:  # the engine died mid-stream: say so, audit what arrived
                    exchange.outcome, exchange.error = "upstream_error", f"{type(exc).__name__}: {exc}"
                    log.warning("entroloop gateway: upstream failed mid-stream for request %s: %s",
                                exchange.request_id, exchange.error)
                    yield error_event("the engine failed while streaming the answer; it is incomplete")
                finished = True
            finally:
                if not finished:  # the client left (the generator is closed or cancelled): no await is safe
                    if exchange.outcome == "ok":
                        exchange.outcome = "client_disconnected"
                    finish()
                    asyncio.get_running_loop().run_in_executor(None, self._record, exchange)
                await answer.aclose()
            finish()
            # Off the event loop (redaction of a long answer is CPU work), before the response ends.
            await asyncio.to_thread(self._record, exchange)

        media = answer.headers.get("content-type", "text/event-stream")
        return StreamingResponse(relay(), answer.status_code, media_type=media)

    # --- records -----------------------------------------------------------------------------
    def _record(self, exchange: Exchange) -> None:
        """End the request's span (its Span record) and publish Audit and (approximate) TokenEntropy;
        never raises. The Span goes first, so whoever sees the Audit finds the Span already out."""
        try:
            records = self.records_for(exchange)
        except Exception:
            self._record_errors += 1
            log.exception("entroloop gateway: records for request %s not built", exchange.request_id)
            records = []
        try:
            self.tracing.end(exchange)
        except Exception:
            self._record_errors += 1
            log.exception("entroloop gateway: span of request %s not ended", exchange.request_id)
        for record in records:
            try:
                self.publish(record)
            except Exception:
                self._record_errors += 1
                log.exception("entroloop gateway: %s for request %s not published", type(record).__name__, exchange.request_id)

    def records_for(self, exchange: Exchange) -> list[Event]:
        """The Audit and TokenEntropy records one finished exchange yields (``audit_records.build_records``)."""
        return build_records(
            exchange,
            stamper=self.stamper,
            redactor=self.redactor,
            route=self.config.route,
            tokenizer_digest=self._tokenizer_digest,
            engine_version=self._engine_version,
            max_record_bytes=self.config.max_record_bytes,
        )

    async def aclose(self) -> None:
        await self.client.aclose()
        # flushes the OTLP batch: off the event loop, it may wait for the collector
        await asyncio.to_thread(self.tracing.shutdown)


__all__ = ["AUDITED_PATHS", "Gateway", "Publish"]
