"""Who may call what: API keys per tenant, and the gateway's access rule per path.

Paths fall into four kinds (``path_kind``), decided by an allow-list so a path nobody thought of is
treated as the most dangerous kind, never the least:

* ``open``: health, version and metrics probes: never need a key;
* ``inference``: the OpenAI inference API (completions, models, embeddings, tokenize, ...): need a
  key when ``ENTROLOOP_GATEWAY_INFERENCE_AUTH`` says so (``auto``: when any key is configured);
* ``feedback``: ``/v1/feedback``: always needs a key (a verdict must be attributable to a tenant);
* ``admin``: everything else, which is where vLLM puts its control plane (``/v1/load_lora_adapter``,
  ``/v1/unload_lora_adapter``, ``/sleep``, ``/wake_up``, ``/reset_prefix_cache``, ``/collective_rpc``,
  ``/pause``, ``/scale_elastic_ep``, ``/start_profile``, ``/server_info``, ...) and where the gateway's
  own ``/admin/`` API lives: needs a key of an admin tenant; with no key configured it is refused
  for everyone, never forwarded.

Keys are compared as SHA-256 digests with ``hmac.compare_digest`` against every configured key
(no early exit), so timing tells nothing about which key or how much of it matched. A key is never
logged, never put in an error message and never forwarded upstream.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

log = logging.getLogger(__name__)

PathKind = Literal["open", "inference", "feedback", "admin"]

OPEN_PATHS = frozenset({"/health", "/ping", "/version", "/metrics"})
INFERENCE_PATHS = frozenset({
    "/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/embeddings", "/v1/responses",
    "/tokenize", "/detokenize", "/pooling", "/classify", "/score", "/v1/score", "/rerank", "/v1/rerank",
    "/v2/rerank", "/v1/audio/transcriptions", "/v1/audio/translations", "/invocations",
})
FEEDBACK_PATHS = frozenset({"/v1/feedback"})
# Not consulted by path_kind (anything unlisted above is admin); named so docs and tests can say which.
KNOWN_ADMIN_PATHS = (
    "/v1/load_lora_adapter", "/v1/unload_lora_adapter", "/sleep", "/wake_up", "/is_sleeping",
    "/reset_prefix_cache", "/reset_mm_cache", "/collective_rpc", "/pause", "/resume", "/is_paused",
    "/scale_elastic_ep", "/is_scaling_elastic_ep", "/start_profile", "/stop_profile", "/server_info",
    "/admin/pause",
)
MIN_KEY_CHARS = 16
_TENANT = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")
_KEY_HINT = "use at least 16 random characters, e.g. python -c 'import secrets; print(secrets.token_urlsafe(32))'"


class GatewayConfigError(ValueError):
    """A gateway setting that cannot work, phrased as the variable and the fix (never a key)."""


def path_kind(path: str) -> PathKind:
    """The access kind of a request path (exact match; anything unlisted is ``admin``)."""
    if path in OPEN_PATHS:
        return "open"
    if path in INFERENCE_PATHS:
        return "inference"
    if path in FEEDBACK_PATHS:
        return "feedback"
    return "admin"


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


@dataclass(frozen=True)
class ApiKeys:
    """Configured keys as (SHA-256 digest, tenant); the keys themselves are not kept."""

    _entries: tuple[tuple[bytes, str], ...] = ()

    def __bool__(self) -> bool:
        return bool(self._entries)

    def __repr__(self) -> str:  # tenants only: a repr ends up in logs
        return f"ApiKeys(tenants={sorted(self.tenants)})"

    @property
    def tenants(self) -> set[str]:
        return {tenant for _, tenant in self._entries}

    def tenant_of(self, presented: str) -> str | None:
        """The tenant of ``presented``, or None; constant time in which key matched."""
        given = _digest(presented)
        found: str | None = None
        for digest, tenant in self._entries:
            if hmac.compare_digest(given, digest):
                found = tenant
        return found

    @classmethod
    def from_pairs(cls, pairs: Iterable[tuple[str, str]], source: str) -> ApiKeys:
        """Keys from (tenant, key) pairs; ``source`` names the setting in error messages."""
        entries: dict[bytes, str] = {}
        for n, (tenant, key) in enumerate(pairs, 1):
            if not _TENANT.match(tenant):
                raise GatewayConfigError(
                    f"{source}: entry {n} has tenant {tenant[:64]!r}; tenants are 1-64 letters, digits or _.@-")
            if len(key) < MIN_KEY_CHARS:
                raise GatewayConfigError(
                    f"{source}: the key of tenant {tenant!r} (entry {n}) has {len(key)} characters; {_KEY_HINT}")
            digest = _digest(key)
            if entries.get(digest, tenant) != tenant:
                raise GatewayConfigError(
                    f"{source}: one key is given to tenants {entries[digest]!r} and {tenant!r}; give each tenant its own key")
            entries[digest] = tenant
        return cls(tuple(entries.items()))

    @classmethod
    def parse_text(cls, text: str, source: str, separator: str = ",") -> ApiKeys:
        """``tenant:key`` entries split by ``separator`` (commas in the variable, lines in a file)."""
        pairs = []
        for n, raw in enumerate(text.split(separator), 1):
            entry = raw.strip()
            if not entry or entry.startswith("#"):
                continue
            tenant, colon, key = entry.partition(":")
            if not colon or not key.strip():
                raise GatewayConfigError(f"{source}: entry {n} is not `tenant:key`; write one tenant:key per "
                                         f"{'line' if separator == chr(10) else 'comma-separated entry'}")
            pairs.append((tenant.strip(), key.strip()))
        return cls.from_pairs(pairs, source)

    @classmethod
    def parse_file(cls, path: Path, source: str) -> ApiKeys:
        """A keys file: a JSON object ``{tenant: key | [keys]}`` or ``tenant:key`` lines."""
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise GatewayConfigError(f"{source}: cannot read {path} ({exc.strerror}); point it at a readable keys file") from None
        if path.stat().st_mode & 0o004:
            log.warning("entroloop gateway: %s is readable by every user; chmod 600 it (it holds API keys)", path)
        if text.lstrip().startswith("{"):
            try:
                data: Any = json.loads(text)
            except ValueError as exc:
                raise GatewayConfigError(f"{source}: {path} is not valid JSON (line {exc.lineno}); "  # type: ignore[attr-defined]
                                         'write {"tenant": "key"} or tenant:key lines') from None
            pairs = []
            for tenant, keys in data.items():
                for key in [keys] if isinstance(keys, str) else keys if isinstance(keys, list) else [None]:
                    if not isinstance(key, str):
                        raise GatewayConfigError(f"{source}: tenant {tenant!r} in {path} needs a key string or a list of them")
                    pairs.append((tenant, key))
            return cls.from_pairs(pairs, source)
        return cls.parse_text(text, source, separator="\n")

    @classmethod
    def from_settings(cls, settings: Any) -> ApiKeys:
        """``ENTROLOOP_GATEWAY_API_KEYS`` and ``ENTROLOOP_GATEWAY_API_KEYS_FILE``, merged."""
        inline = cls.parse_text(settings.gateway_api_keys.get_secret_value(), "ENTROLOOP_GATEWAY_API_KEYS")
        entries = list(inline._entries)
        if settings.gateway_api_keys_file is not None:
            from_file = cls.parse_file(Path(settings.gateway_api_keys_file), "ENTROLOOP_GATEWAY_API_KEYS_FILE")
            entries.extend(from_file._entries)
        merged: dict[bytes, str] = {}
        for digest, tenant in entries:
            if merged.get(digest, tenant) != tenant:
                raise GatewayConfigError("ENTROLOOP_GATEWAY_API_KEYS and ENTROLOOP_GATEWAY_API_KEYS_FILE give one key to "
                                         f"tenants {merged[digest]!r} and {tenant!r}; give each tenant its own key")
            merged[digest] = tenant
        return cls(tuple(merged.items()))


def presented_key(headers: Headers) -> str | None:
    """The key a request carries: ``Authorization: Bearer KEY``, else ``X-API-Key``."""
    scheme, _, value = headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and value.strip():
        return value.strip()
    return headers.get("x-api-key") or None


@dataclass(frozen=True)
class AccessPolicy:
    """The gateway's access rule: which kind of path needs which key."""

    keys: ApiKeys = field(default_factory=ApiKeys)
    inference_auth: str = "auto"  # auto | required | open
    admin_tenants: frozenset[str] = frozenset({"admin"})

    def __post_init__(self) -> None:
        if self.inference_auth not in ("auto", "required", "open"):
            raise GatewayConfigError(f"ENTROLOOP_GATEWAY_INFERENCE_AUTH is {self.inference_auth!r}; use auto, required or open")
        if self.inference_auth == "required" and not self.keys:
            raise GatewayConfigError("ENTROLOOP_GATEWAY_INFERENCE_AUTH=required but no API key is configured; set "
                                     "ENTROLOOP_GATEWAY_API_KEYS_FILE (tenant:key lines) or ENTROLOOP_GATEWAY_API_KEYS")

    @property
    def inference_needs_key(self) -> bool:
        return self.inference_auth == "required" or (self.inference_auth == "auto" and bool(self.keys))

    def decide(self, kind: PathKind, key: str | None) -> tuple[int, str, str]:
        """(HTTP status, tenant, refusal message): 200 to let the request through."""
        if kind == "open" or (kind == "inference" and not self.inference_needs_key):
            tenant = self.keys.tenant_of(key) if key and self.keys else None
            return 200, tenant or "", ""
        if kind in ("admin", "feedback") and not self.keys:
            return 403, "", ("this path is refused: the gateway has no API key configured (set "
                             "ENTROLOOP_GATEWAY_API_KEYS_FILE with a key of an admin tenant)")
        if key is None:
            return 401, "", "an API key is required: send Authorization: Bearer <key> or X-API-Key: <key>"
        tenant = self.keys.tenant_of(key)
        if tenant is None:
            return 403, "", "the API key is not valid"
        if kind == "admin" and tenant not in self.admin_tenants:
            return 403, tenant, (f"tenant {tenant!r} may not use admin paths "
                                 "(ENTROLOOP_GATEWAY_ADMIN_TENANTS lists those that may)")
        return 200, tenant, ""


class AuthMiddleware:
    """ASGI middleware: refuse (401/403) or let through with ``scope['state']['tenant']`` set.

    Runs before anything reads the body, so a refused request costs its headers only."""

    def __init__(self, app: ASGIApp, policy: AccessPolicy) -> None:
        self.app = app
        self.policy = policy
        self.refused = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        kind = path_kind(scope["path"])
        status, tenant, message = self.policy.decide(kind, presented_key(Headers(scope=scope)))
        if status != 200:
            self.refused += 1
            client = (scope.get("client") or ("?", 0))[0]
            log.info("entroloop gateway: %s %s from %s refused (%d, %s path)", scope["method"], scope["path"], client,
                     status, kind)
            headers = {"WWW-Authenticate": "Bearer"} if status == 401 else {}
            error = {"message": message, "type": "authentication_error" if status == 401 else "permission_error"}
            await JSONResponse({"error": error}, status, headers=headers)(scope, receive, send)
            return
        scope.setdefault("state", {})["tenant"] = tenant
        await self.app(scope, receive, send)


__all__ = [
    "FEEDBACK_PATHS",
    "INFERENCE_PATHS",
    "KNOWN_ADMIN_PATHS",
    "OPEN_PATHS",
    "AccessPolicy",
    "ApiKeys",
    "AuthMiddleware",
    "GatewayConfigError",
    "path_kind",
    "presented_key",
]
