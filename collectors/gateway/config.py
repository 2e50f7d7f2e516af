"""What the gateway needs; ``GatewayConfig.from_settings`` maps the ``ENTROLOOP_GATEWAY_*`` variables."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from entroloop.collectors.gateway.auth import AccessPolicy, ApiKeys

from entroloop.contract.settings import Settings


@dataclass
class GatewayConfig:
    """The gateway's configuration (tests build it directly; the CLI from settings)."""

    upstream: str
    engine: str = "auto"  # vllm | openai | auto
    node_id: str = "node-local"
    route: str = "default"
    engine_version: str = ""
    tokenizer_digest: str = ""
    top_logprobs: int = 20
    timeout_s: float = 600.0
    adapter_routing: bool = False  # route base-model requests to promoted/canary adapters (routing.py)
    api_keys: ApiKeys = field(default_factory=ApiKeys)
    inference_auth: str = "auto"  # auto (keys required when configured) | required | open
    admin_tenants: frozenset[str] = frozenset({"admin"})
    upstream_api_key: str = field(default="", repr=False)  # never in a repr, so never in a log line
    max_body_bytes: int = 2 << 20
    max_record_bytes: int = 1 << 20  # an Audit over this is published in parts
    feedback_rate_per_min: float = 60.0  # POST /v1/feedback per (tenant, user) and minute
    feedback_tenant_rate_per_min: float = 6000.0  # POST /v1/feedback per tenant (all users) and minute
    fallback_upstream: str = ""  # where POST /admin/routes/ROUTE/tier {"tier": "fallback"} sends requests
    otlp_endpoint: str = ""  # OTLP/HTTP traces endpoint the gateway's spans also go to (tracing.py)

    def access_policy(self) -> AccessPolicy:
        """The access rule (raises ``GatewayConfigError`` for a setting that cannot work)."""
        return AccessPolicy(self.api_keys, self.inference_auth, self.admin_tenants)

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
            "api_keys": ApiKeys.from_settings(settings),
            "inference_auth": settings.gateway_inference_auth,
            "admin_tenants": frozenset(t.strip() for t in settings.gateway_admin_tenants.split(",") if t.strip()),
            "upstream_api_key": settings.gateway_upstream_api_key.get_secret_value(),
            "max_body_bytes": settings.gateway_max_body_bytes,
            "max_record_bytes": settings.max_record_bytes,
            "feedback_rate_per_min": settings.gateway_feedback_rate_per_min,
            "feedback_tenant_rate_per_min": settings.gateway_feedback_tenant_rate_per_min,
            "fallback_upstream": settings.gateway_fallback_upstream,
            "otlp_endpoint": settings.gateway_otlp_endpoint,
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


__all__ = ["GatewayConfig"]
