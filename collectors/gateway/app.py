"""The audit gateway: a thin OpenAI-compatible proxy in front of vLLM or any OpenAI-compatible engine.

For ``POST /v1/chat/completions`` and ``POST /v1/completions`` it

1. takes the caller's W3C ``traceparent`` (or starts a trace) and an ``X-Request-Id`` (or makes one),
   and passes both on: a ``traceparent`` header naming the gateway's span as parent (vLLM's own
   tracing joins the trace) and, for vLLM, ``vllm_xargs.entroloop_request_id`` /
   ``entroloop_trace_id`` so the entropy tap's TokenEntropy records carry the same ids;
2. for engines that are not vLLM (no tap), asks for top-k logprobs and derives an approximate
   entropy per token (``TokenEntropy.approximate=True``), removing the logprobs from the answer
   when the client did not ask for them, so the client sees what the engine would have sent it;
3. after the answer has gone to the client (a Starlette background task: no added latency), redacts
   PII from prompt and response and publishes an Audit record, a request Span and (non-vLLM) the
   approximate TokenEntropy;
4. with adapter routing on (``ENTROLOOP_GATEWAY_ADAPTER_ROUTING``), rewrites a base model's name to
   its promoted or, for a sticky share of users, canary LoRA adapter (``routing.py``: the state the
   publisher writes to ClickHouse), and names that adapter in the Audit record and the Span.

Every other path is forwarded unchanged. Streaming (``"stream": true``) is relayed as it comes while
the deltas are collected for the audit: byte for byte from vLLM; from other engines each event
carrying logprobs the client did not ask for is re-serialised without them.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from collectors import tracecontext
from collectors.gateway import capture
from collectors.gateway.routing import RoutingTable
from collectors.gateway.topk_entropy import (
    chat_token_entropies,
    completion_token_entropies,
)
from collectors.pii import PiiRedactor
from entroloop.contract.ids import NodeStamper, new_span_id, uuid7
from entroloop.contract.records import Audit, Event, Span, TokenEntropy, pack_entropies
from entroloop.contract.settings import Settings

log = logging.getLogger(__name__)

Publish = Callable[[Event], object]

AUDITED_PATHS = ("/v1/chat/completions", "/v1/completions")
# Hop-by-hop and length headers are the proxy's own business, never forwarded.
_DROP_HEADERS = {"host", "content-length", "connection", "keep-alive", "transfer-encoding", "upgrade", "accept-encoding"}
HEADER_PROMPT_VERSION = "x-entroloop-prompt-version"
HEADER_TENANT = "x-entroloop-tenant"
HEADER_REQUEST_ID = "x-request-id"
ADAPTER_CACHE_S = 60.0


@dataclass
class GatewayConfig:
    """What the gateway needs; ``from_settings`` maps the ``ENTROLOOP_GATEWAY_*`` variables."""

    upstream: str
    engine: str = "auto"  # vllm | openai | auto
    node_id: str = "node-local"
    route: str = "default"
    engine_version: str = ""
    tokenizer_digest: str = ""
    top_logprobs: int = 20
    timeout_s: float = 600.0
    adapter_routing: bool = False  # route base-model requests to promoted/canary adapters (routing.py)

    @classmethod
    def from_settings(cls, settings: Settings, **overrides: Any) -> GatewayConfig:
        values: dict[str, Any] = {
            "upstream": settings.gateway_upstream,
            "engine": settings.gateway_engine,
            "node_id": settings.node_id,
            "route": settings.gateway_route,
            "engine_version": settings.gateway_engine_version,
            "tokenizer_digest": settings.gateway_tokenizer_digest,
            "top_logprobs": settings.gateway_top_logprobs,
            "timeout_s": settings.gateway_timeout_s,
            "adapter_routing": settings.gateway_adapter_routing,
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


@dataclass
class _Exchange:
    """One audited request as it goes through the gateway."""

    path: str
    body: dict[str, Any]
    headers: dict[str, str]
    trace: tracecontext.TraceContext
    request_id: str
    span_id: str
    engine: str
    start: float
    model: str = ""
    adapter: str = ""
    routed: str = ""  # "canary" or "stable" when adapter routing chose the served model, else ""
    end: float = 0.0
    ttft_s: float | None = None
    status_code: int = 0
    response: dict[str, Any] = field(default_factory=dict)
    entropies: list[float] = field(default_factory=list)


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
        # identity: streamed bytes are relayed raw, so the engine must not compress them
        self.client = httpx.AsyncClient(
            base_url=config.upstream.rstrip("/"),
            timeout=config.timeout_s,
            transport=transport,
            headers={"Accept-Encoding": "identity"},
        )
        self._engine = None if config.engine == "auto" else config.engine
        self._engine_version = config.engine_version
        self._tokenizer_digest = config.tokenizer_digest
        self._parents: dict[str, str | None] = {}  # served model id -> base model (LoRA) or None
        self._models_fetched_at = -ADAPTER_CACHE_S
        self._unserved_adapters: set[str] = set()
        self.publish_errors = 0

    # --- engine facts, asked once ------------------------------------------------------------
    async def engine(self) -> str:
        """``vllm`` when the upstream answers vLLM's ``/version``, else ``openai`` (asked once)."""
        if self._engine is None:
            kind, version = "openai", ""
            try:
                answer = await self.client.get("/version", timeout=5.0)
                if answer.status_code == 200 and "version" in answer.json():
                    kind, version = "vllm", f"vllm {answer.json()['version']}"
            except (httpx.HTTPError, ValueError):
                pass
            self._engine = kind
            self._engine_version = self._engine_version or version
            if kind == "vllm" and not self._tokenizer_digest:
                self._tokenizer_digest = await self._vllm_tokenizer_digest()
        return self._engine

    async def _vllm_tokenizer_digest(self) -> str:
        """sha256 of vLLM's /tokenizer_info (served with --enable-tokenizer-info-endpoint), else ''."""
        try:
            answer = await self.client.get("/tokenizer_info", timeout=5.0)
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
                answer = await self.client.get("/v1/models", timeout=5.0)
                for card in answer.json().get("data", []):
                    self._parents[card["id"]] = card.get("parent")
            except (httpx.HTTPError, ValueError, KeyError, AttributeError):
                pass
        parent = self._parents.get(model)
        return (parent, model) if parent else (model, "")

    # --- request path ------------------------------------------------------------------------
    def _upstream_headers(self, request: Request) -> dict[str, str]:
        return {k: v for k, v in request.headers.items() if k.lower() not in _DROP_HEADERS | {"traceparent", "tracestate"}}

    async def proxy(self, request: Request) -> Response:
        """Any other path: forwarded as it is."""
        try:
            answer = await self.client.request(
                request.method,
                request.url.path,
                params=request.query_params,
                content=await request.body(),
                headers=self._upstream_headers(request),
            )
        except httpx.HTTPError as exc:
            return JSONResponse({"error": {"message": f"upstream unreachable: {exc}", "type": "gateway"}}, 502)
        return _relay(answer)

    async def audited(self, request: Request) -> Response:
        """Chat and text completions: forward with correlation ids, then audit in the background."""
        raw = await request.body()
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("not an object")
        except ValueError:
            return await self.proxy(request)
        headers = {k.lower(): v for k, v in request.headers.items()}
        trace = tracecontext.extract(headers)
        exchange = _Exchange(
            path=request.url.path,
            body=body,
            headers=headers,
            trace=trace,
            request_id=headers.get(HEADER_REQUEST_ID) or uuid7(),
            span_id=new_span_id(),
            engine=await self.engine(),
            start=time.time(),
        )
        body = exchange.body = self._route(exchange)
        if not exchange.routed:
            exchange.model, exchange.adapter = await self.base_and_adapter(str(body.get("model", "")))
        upstream_headers = self._upstream_headers(request)
        tracecontext.inject(upstream_headers, trace, exchange.span_id)
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
            return JSONResponse(
                {"error": {"message": f"upstream unreachable: {exc}", "type": "gateway"}},
                502,
                background=BackgroundTask(self._record, exchange),
            )
        exchange.end, exchange.status_code = time.time(), answer.status_code
        try:
            data = answer.json() if answer.status_code == 200 else None
        except ValueError:
            data = None
        if not isinstance(data, dict):
            return _relay(answer, BackgroundTask(self._record, exchange))
        exchange.response = data
        if upstream_body is body or exchange.engine == "vllm":
            return _relay(answer, BackgroundTask(self._record, exchange))  # byte for byte
        exchange.entropies = _approximate_entropies(exchange.path, data)
        _restore_client_logprobs(exchange.path, data, client_logprobs)
        return JSONResponse(data, answer.status_code, background=BackgroundTask(self._record, exchange))

    def _route(self, exchange: _Exchange) -> dict[str, Any]:
        """The client's body with ``model`` rewritten by adapter routing (the body itself when the
        routing leaves it alone). Sticky per user (``user`` / ``X-User-Id``), else per request id."""
        requested = exchange.body.get("model")
        if self.routing is None or not isinstance(requested, str) or not requested:
            return exchange.body
        key = capture.user_of(exchange.body, exchange.headers) or exchange.request_id
        try:
            served, routing = self.routing.route(requested, key)
        except Exception:  # noqa: BLE001 - routing must never fail a request
            log.exception("entroloop gateway: adapter routing failed for %s; serving it as named", requested)
            return exchange.body
        if routing is None:
            return exchange.body
        exchange.model = routing.model
        exchange.adapter = "" if served == routing.model else served
        exchange.routed = "canary" if routing.canary and served == routing.canary else "stable"
        return exchange.body if served == requested else {**exchange.body, "model": served}

    def _unroute(self, exchange: _Exchange) -> dict[str, Any]:
        """Back to the base model the client named, after the engine refused the routed adapter."""
        if exchange.adapter not in self._unserved_adapters:  # once per adapter, not per request
            self._unserved_adapters.add(exchange.adapter)
            log.warning("entroloop gateway: upstream answers 404 for routed adapter %s; its requests go to %s",
                        exchange.adapter, exchange.model)
        exchange.adapter, exchange.routed = "", "stable"
        return {**exchange.body, "model": exchange.model}

    def _upstream_body(self, exchange: _Exchange) -> tuple[dict[str, Any], Any]:
        """The body sent upstream, and what the client asked for in logprobs (to give back only that)."""
        body = exchange.body
        if exchange.engine == "vllm":
            xargs = dict(body.get("vllm_xargs") or {})
            xargs.update(entroloop_request_id=exchange.request_id, entroloop_trace_id=exchange.trace.trace_id)
            return {**body, "vllm_xargs": xargs}, None
        k = self.config.top_logprobs
        if exchange.path.endswith("chat/completions"):
            asked = int(body.get("top_logprobs") or 0) if body.get("logprobs") else None
            return {**body, "logprobs": True, "top_logprobs": max(k, asked or 0)}, asked
        asked = body.get("logprobs")
        asked = int(asked) if isinstance(asked, int) and not isinstance(asked, bool) else None
        return {**body, "logprobs": max(k, asked or 0)}, asked

    async def _stream(
        self, exchange: _Exchange, upstream_body: dict[str, Any], headers: dict[str, str], client_logprobs: int | None
    ) -> Response:
        """Relay the SSE stream, collecting the deltas for the audit.

        vLLM's stream goes through byte for byte. From another engine the logprobs the gateway
        added are taken out of each event (re-serialised) after their entropies are read.
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
            return JSONResponse({"error": {"message": f"upstream unreachable: {exc}", "type": "gateway"}}, 502,
                                background=BackgroundTask(self._record, exchange))
        exchange.status_code = answer.status_code
        collector = _StreamCollector(exchange, rewrite=injected and answer.status_code == 200, asked=client_logprobs)

        async def relay() -> AsyncIterator[bytes]:
            try:
                async for chunk in answer.aiter_raw():
                    out = collector.feed(chunk)
                    if out:
                        yield out
                rest = collector.flush()
                if rest:
                    yield rest
            finally:
                await answer.aclose()
                exchange.end = time.time()
                exchange.response = collector.as_response()
                exchange.entropies = collector.entropies

        media = answer.headers.get("content-type", "text/event-stream")
        return StreamingResponse(relay(), answer.status_code, media_type=media, background=BackgroundTask(self._record, exchange))

    # --- records -----------------------------------------------------------------------------
    def _record(self, exchange: _Exchange) -> None:
        """Build and publish Audit, Span and (approximate) TokenEntropy; never raises."""
        try:
            records = self.records_for(exchange)
        except Exception:  # noqa: BLE001 - a bad answer must not take the gateway down
            self.publish_errors += 1
            log.exception("entroloop gateway: records for request %s not built", exchange.request_id)
            return
        for record in records:
            try:
                self.publish(record)
            except Exception:  # noqa: BLE001
                self.publish_errors += 1
                log.exception("entroloop gateway: %s for request %s not published", type(record).__name__, exchange.request_id)

    def records_for(self, exchange: _Exchange) -> list[Event]:
        """The records one finished exchange yields (redaction happens before the Audit is built)."""
        common = {"request_id": exchange.request_id, "trace_id": exchange.trace.trace_id}
        usage = exchange.response.get("usage") or {}
        ok = exchange.status_code == 200 and bool(exchange.response)
        span = Span(
            **self.stamper.stamp(exchange.end),  # type: ignore[arg-type]
            **common,
            span_id=exchange.span_id,
            parent_span_id=exchange.trace.parent_span_id,
            name=f"gateway {exchange.path}",
            start_time=exchange.start,
            end_time=exchange.end,
            model=exchange.model,
            route=self.config.route,
            status="ok" if ok else "error",
            ttft_s=exchange.ttft_s,
            e2e_s=exchange.end - exchange.start,
            prompt_tokens=usage.get("prompt_tokens"),
            output_tokens=usage.get("completion_tokens"),
            attributes={
                "http.status_code": exchange.status_code,
                "entroloop.engine": exchange.engine,
                "entroloop.adapter": exchange.adapter,
                "entroloop.routed": exchange.routed,
                "entroloop.stream": bool(exchange.body.get("stream")),
            },
        )
        if not ok:
            return [span]
        redacted = capture.redact_exchange(
            capture.prompt_of(exchange.path, exchange.body),
            capture.response_texts(exchange.path, exchange.response),
            self.redactor,
        )
        audit = Audit(
            **self.stamper.stamp(exchange.end),  # type: ignore[arg-type]
            **common,
            audit_id=uuid7(exchange.end),
            model=exchange.model,
            adapter=exchange.adapter,
            prompt=redacted.prompt,
            response=redacted.response,
            route=self.config.route,
            tenant=exchange.headers.get(HEADER_TENANT, ""),
            user_id=self.redactor.pseudonymise_user(capture.user_of(exchange.body, exchange.headers)),
            prompt_template_version=exchange.headers.get(HEADER_PROMPT_VERSION, ""),
            sampling=capture.sampling_of(exchange.body),
            tokenizer_digest=self._tokenizer_digest,
            engine_version=self._engine_version,
            redactions=redacted.counts,
        )
        records: list[Event] = [audit, span]
        if exchange.entropies:
            records.append(
                TokenEntropy(
                    **self.stamper.stamp(exchange.end),  # type: ignore[arg-type]
                    **common,
                    model=exchange.model,
                    route=self.config.route,
                    adapter=exchange.adapter,
                    entropies=pack_entropies(exchange.entropies),
                    approximate=True,
                )
            )
        return records

    async def aclose(self) -> None:
        await self.client.aclose()


class _StreamCollector:
    """Collects an SSE completion stream's text deltas and usage into a non-streaming-shaped answer."""

    def __init__(self, exchange: _Exchange, rewrite: bool = False, asked: int | None = None) -> None:
        self.exchange = exchange
        self.rewrite = rewrite  # take the gateway's logprobs out of each event (non-vLLM engines)
        self.asked = asked
        self.entropies: list[float] = []
        self._buffer = b""
        self._texts: dict[int, list[str]] = {}
        self._usage: dict[str, Any] = {}
        self._chat = exchange.path.endswith("chat/completions")

    def feed(self, chunk: bytes) -> bytes:
        """Read complete lines; returns the bytes to send on (``chunk`` itself unless rewriting)."""
        self._buffer += chunk
        out: list[bytes] = []
        while b"\n" in self._buffer:
            line, self._buffer = self._buffer.split(b"\n", 1)
            out.append(self._line(line) + b"\n")
        return b"".join(out) if self.rewrite else chunk

    def flush(self) -> bytes:
        """What is left after the last newline (normally nothing)."""
        rest, self._buffer = self._buffer, b""
        return self._line(rest) if self.rewrite and rest else b""

    def _line(self, line: bytes) -> bytes:
        stripped = line.strip()
        if not stripped.startswith(b"data:"):
            return line
        payload = stripped[5:].strip()
        if payload == b"[DONE]":
            return line
        try:
            event = json.loads(payload)
        except ValueError:
            return line
        if not isinstance(event, dict):
            return line
        self._usage = event.get("usage") or self._usage
        for choice in event.get("choices") or []:
            text = (choice.get("delta") or {}).get("content") if self._chat else choice.get("text")
            if text:
                if self.exchange.ttft_s is None:
                    self.exchange.ttft_s = time.time() - self.exchange.start
                self._texts.setdefault(int(choice.get("index", 0)), []).append(text)
        if not self.rewrite:
            return line
        first = [c for c in event.get("choices") or [] if int(c.get("index", 0)) == 0]
        if first:
            self.entropies += _approximate_entropies(self.exchange.path, {"choices": first})
        _restore_client_logprobs(self.exchange.path, event, self.asked)
        return b"data: " + json.dumps(event, ensure_ascii=False, separators=(",", ":")).encode()

    def as_response(self) -> dict[str, Any]:
        choices = []
        for index in sorted(self._texts):
            text = "".join(self._texts[index])
            choices.append({"index": index, "message": {"content": text}} if self._chat else {"index": index, "text": text})
        return {"choices": choices, "usage": self._usage}


def _relay(answer: httpx.Response, background: BackgroundTask | None = None) -> Response:
    headers = {k: v for k, v in answer.headers.items() if k.lower() not in _DROP_HEADERS | {"content-encoding", "content-type"}}
    return Response(answer.content, answer.status_code, headers=headers,
                    media_type=answer.headers.get("content-type"), background=background)


def _approximate_entropies(path: str, data: dict[str, Any]) -> list[float]:
    """Per-token entropy of the first choice from its top-k logprobs."""
    choices = data.get("choices") or []
    if not choices:
        return []
    logprobs = choices[0].get("logprobs")
    return chat_token_entropies(logprobs) if path.endswith("chat/completions") else completion_token_entropies(logprobs)


def _restore_client_logprobs(path: str, data: dict[str, Any], asked: int | None) -> None:
    """Give the client the logprobs it asked for and no more (none if it asked for none)."""
    for choice in data.get("choices") or []:
        logprobs = choice.get("logprobs")
        if asked is None or logprobs is None:
            choice["logprobs"] = None
        elif path.endswith("chat/completions"):
            for token in logprobs.get("content") or []:
                token["top_logprobs"] = (token.get("top_logprobs") or [])[:asked]
        else:
            logprobs["top_logprobs"] = [
                dict(sorted(top.items(), key=lambda kv: kv[1], reverse=True)[:asked]) if top else top
                for top in logprobs.get("top_logprobs") or []
            ]


def create_app(
    config: GatewayConfig,
    publish: Publish,
    redactor: PiiRedactor,
    transport: httpx.AsyncBaseTransport | None = None,
    routing: RoutingTable | None = None,
) -> Starlette:
    """The ASGI app (serve it with uvicorn); ``app.state.gateway`` is the Gateway.

    With ``routing`` the app refreshes it in the background while it runs (lifespan)."""
    gateway = Gateway(config, publish, redactor, transport, routing)

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
    routes.append(Route("/{path:path}", gateway.proxy, methods=["GET", "POST", "PUT", "DELETE", "PATCH", "OPTIONS", "HEAD"]))
    app = Starlette(routes=routes, lifespan=lifespan)
    app.state.gateway = gateway
    return app


def app_from_settings(settings: Settings, publish: Publish | None = None, **overrides: Any) -> Starlette:
    """The gateway as configured by ``ENTROLOOP_`` settings, publishing through the node publisher."""
    if publish is None:
        from collectors.vllm.emit import resolve_sink

        publish = resolve_sink("publisher", settings)  # type: ignore[assignment]
    config = GatewayConfig.from_settings(settings, **overrides)
    routing = RoutingTable.from_settings(settings) if config.adapter_routing else None
    return create_app(config, publish, PiiRedactor.from_settings(settings), routing=routing)


__all__ = ["AUDITED_PATHS", "Gateway", "GatewayConfig", "app_from_settings", "create_app"]
