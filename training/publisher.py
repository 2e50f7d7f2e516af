"""Publisher: load an adapter into running vLLM servers at run time, canary it, promote or roll back.

vLLM's runtime LoRA API (servers started with ``--enable-lora`` and the environment variable
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``): ``POST /v1/load_lora_adapter {"lora_name", "lora_path"}``
and ``POST /v1/unload_lora_adapter {"lora_name"}``. A loaded adapter is served as a model of its
own: requests naming ``model: <lora_name>`` use it, so every span, fallback and alert of canary
traffic carries the adapter id as its model, which is how the canary's live metrics are selected.

Canary (the 3-3-3 protocol: three stages, each ``stage_seconds`` long, each needing
``checks_per_stage`` healthy checks; shares configurable, default 3% -> 30% -> 100%):

* ``CanaryRouter`` sends a deterministic, sticky share of request ids to the adapter;
* ``CanaryController`` is a pure state machine: each check's ``CanaryHealth`` (requests, errors,
  fallbacks, entropy anomalies since the stage began) either rolls back at once (any rate over its
  limit once the canary has ``min_requests``), counts as a healthy check, or waits for traffic;
  a stage with all its checks healthy and its time served widens, and the last stage promotes;
* ``AdapterPublisher`` drives it against the servers, the registry and the metrics query, and
  records every step as an Action record. On rollback it routes all traffic back to the previous
  adapter (or the base model) first, then unloads the canary from every server.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from entroloop.training.actions import ActionLog

from entroloop.infra.adapter_routing import AdapterRouting, bucket


class VllmError(RuntimeError):
    """A vLLM server answered with an error or could not be reached."""


class VllmLoraClient:
    """The runtime LoRA API and the completions endpoint of one vLLM OpenAI-compatible server."""

    def __init__(self, base_url: str, timeout: float = 60.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def _post(self, path: str, body: dict[str, Any]) -> str:
        request = urllib.request.Request(
            self.base_url + path, data=json.dumps(body).encode(), method="POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                return response.read().decode()
        except urllib.error.HTTPError as exc:
            raise VllmError(f"{self.base_url}{path}: HTTP {exc.code}: {exc.read().decode()[:500]}") from None
        except OSError as exc:
            raise VllmError(f"{self.base_url}{path}: {exc}") from None

    def load(self, name: str, path: str) -> str:
        return self._post("/v1/load_lora_adapter", {"lora_name": name, "lora_path": path})

    def unload(self, name: str) -> str:
        return self._post("/v1/unload_lora_adapter", {"lora_name": name})

    def models(self) -> list[str]:
        try:
            with urllib.request.urlopen(self.base_url + "/v1/models", timeout=self.timeout) as response:
                return [m["id"] for m in json.loads(response.read())["data"]]
        except OSError as exc:
            raise VllmError(f"{self.base_url}/v1/models: {exc}") from None

    def complete(self, model: str, prompt: str, max_tokens: int = 8) -> dict[str, Any]:
        return json.loads(self._post("/v1/completions", {
            "model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
        }))


class CanaryRouter:
    """Which model serves a request: the canary adapter for a sticky share of request ids.

    A mutable, thread-safe holder of an ``AdapterRouting`` (``entroloop.infra.adapter_routing``): the
    decision itself is the shared one the gateway makes on live traffic, so this process's view and
    the serving path agree on which keys the canary gets."""

    def __init__(self, base_model: str, stable: str = "") -> None:
        self._state = AdapterRouting(base_model).promoted(stable or base_model)
        self._lock = threading.Lock()

    bucket = staticmethod(bucket)

    @property
    def state(self) -> AdapterRouting:
        return self._state

    @property
    def base_model(self) -> str:
        return self._state.model

    @property
    def stable(self) -> str:
        """The promoted adapter, or the base model."""
        return self._state.served_stable

    @property
    def canary(self) -> str:
        return self._state.canary

    @property
    def share(self) -> float:
        return self._state.share

    def set_canary(self, adapter: str, share: float) -> None:
        with self._lock:
            self._state = self._state.with_canary(adapter, share)

    def promote(self, adapter: str) -> None:
        with self._lock:
            self._state = self._state.promoted(adapter)

    def clear_canary(self) -> None:
        with self._lock:
            self._state = self._state.without_canary()

    @classmethod
    def from_routing(cls, base_model: str, routing: dict[str, Any]) -> CanaryRouter:
        """The router as the registry's status history says it is now (``AdapterRegistry.routing``):
        the durable routing state, shared by every process that reads ClickHouse."""
        router = cls(base_model)
        router._state = AdapterRouting.from_dict(routing, model=base_model)
        return router

    def choose(self, request_id: str) -> str:
        return self._state.choose(request_id)  # one immutable state read: no lock needed


@dataclass(frozen=True)
class CanaryHealth:
    requests: int
    errors: int = 0
    fallbacks: int = 0
    anomalies: int = 0

    def rate(self, count: int) -> float:
        return count / self.requests if self.requests else 0.0


@dataclass(frozen=True)
class CanaryPolicy:
    shares: tuple[float, ...] = (0.03, 0.3, 1.0)
    stage_seconds: float = 180.0
    checks_per_stage: int = 3
    min_requests: int = 20
    error_rate_limit: float = 0.03
    fallback_rate_limit: float = 0.1
    anomaly_rate_limit: float = 0.05
    # Checks in a row without enough canary traffic before the canary is abandoned (rolled back):
    # an adapter nobody is sent to must not sit half-rolled-out forever.
    max_idle_checks: int = 30

    @classmethod
    def from_settings(cls, settings: Any, **overrides: Any) -> CanaryPolicy:
        values = dict(
            shares=tuple(settings.canary_stage_shares), stage_seconds=settings.canary_stage_seconds,
            checks_per_stage=settings.canary_checks_per_stage, min_requests=settings.canary_min_requests,
            error_rate_limit=settings.canary_error_rate_limit,
            fallback_rate_limit=settings.canary_fallback_rate_limit,
            anomaly_rate_limit=settings.canary_anomaly_rate_limit,
        )
        values.update(overrides)
        return cls(**values)

    @property
    def check_interval(self) -> float:
        return self.stage_seconds / self.checks_per_stage


@dataclass(frozen=True)
class Decision:
    kind: str  # "widen", "promote", "rollback", "healthy", "wait"
    stage: int
    share: float
    reason: str = ""


class CanaryController:
    """The canary's state machine; time and health come from outside, so it is tested without I/O."""

    def __init__(self, policy: CanaryPolicy) -> None:
        if not policy.shares or any(not 0 < s <= 1 for s in policy.shares):
            raise ValueError("canary shares must be in (0, 1]")
        self.policy = policy
        self.stage = 0
        self.healthy_checks = 0
        self.stage_started = 0.0
        self.idle_checks = 0
        self.state = "pending"

    @property
    def share(self) -> float:
        return self.policy.shares[self.stage]

    def start(self, now: float) -> Decision:
        self.state, self.stage, self.healthy_checks, self.stage_started = "canary", 0, 0, now
        return Decision("widen", 0, self.share, "canary started")

    def verdict(self, health: CanaryHealth) -> str:
        """Why ``health`` fails the canary ("" when it does not)."""
        p = self.policy
        if health.requests < p.min_requests:
            return ""
        for name, count, limit in (
            ("error", health.errors, p.error_rate_limit),
            ("fallback", health.fallbacks, p.fallback_rate_limit),
            ("entropy anomaly", health.anomalies, p.anomaly_rate_limit),
        ):
            if health.rate(count) > limit:
                return f"{name} rate {health.rate(count):.4f} > limit {limit} over {health.requests} requests"
        return ""

    def observe(self, health: CanaryHealth, now: float) -> Decision:
        if self.state != "canary":
            raise RuntimeError(f"canary is {self.state}, not running")
        failure = self.verdict(health)
        if failure:
            self.state = "rolled_back"
            return Decision("rollback", self.stage, self.share, failure)
        if health.requests < self.policy.min_requests:
            self.idle_checks += 1
            if self.idle_checks >= self.policy.max_idle_checks:
                self.state = "rolled_back"
                return Decision("rollback", self.stage, self.share,
                                f"no canary traffic: {self.idle_checks} checks under {self.policy.min_requests} requests")
            return Decision("wait", self.stage, self.share,
                            f"{health.requests} < {self.policy.min_requests} canary requests: not judged yet")
        self.idle_checks = 0
        self.healthy_checks += 1
        served = now - self.stage_started >= self.policy.stage_seconds - 1e-9
        if self.healthy_checks < self.policy.checks_per_stage or not served:
            return Decision("healthy", self.stage, self.share,
                            f"check {self.healthy_checks}/{self.policy.checks_per_stage} healthy")
        if self.stage + 1 == len(self.policy.shares):
            self.state = "promoted"
            return Decision("promote", self.stage, self.share, "every stage healthy")
        self.stage, self.healthy_checks, self.stage_started = self.stage + 1, 0, now
        return Decision("widen", self.stage, self.share, "stage healthy")


MetricsQuery = Callable[[str, float], CanaryHealth]
"""(adapter id, since unix time) -> the canary's health since then."""


class ClickHouseCanaryMetrics:
    """Canary health from ClickHouse.

    Canary requests are the request spans whose model is the adapter id (vLLM reports the adapter
    name as the model of its requests, and so does the gateway). Fallbacks and entropy-anomaly
    alerts count when they name the adapter as model *or* belong to one of those requests: the
    entropy tap labels tokens with the engine's served model name, so its alerts are attributed
    to the canary through ``request_id``.
    """

    def __init__(self, client: Any, database: str,
                 anomaly_rules: Sequence[str] = ("repetition_loop", "gibberish", "entropy_baseline_shift")) -> None:
        self.client, self.database, self.rules = client, database, tuple(anomaly_rules)

    def __call__(self, adapter_id: str, since: float) -> CanaryHealth:
        db, params = self.database, {"m": adapter_id, "t": since, "rules": list(self.rules)}
        where = "model = %(m)s AND name = 'llm_request' AND emitted_at >= toDateTime64(%(t)s, 3)"
        canary = f"SELECT request_id FROM {db}.spans FINAL WHERE {where}"
        requests, errors = self.client.query(
            f"SELECT count(), countIf(status != 'ok') FROM {db}.spans FINAL WHERE {where}", parameters=params,
        ).result_rows[0]
        fallbacks = self.client.query(
            f"SELECT uniqExact(request_id) FROM {db}.fallbacks FINAL WHERE emitted_at >= toDateTime64(%(t)s, 3) "
            f"AND (model = %(m)s OR request_id IN ({canary}))", parameters=params,
        ).result_rows[0][0]
        anomalies = self.client.query(
            f"SELECT uniqExact(request_id) FROM {db}.alerts FINAL WHERE rule IN %(rules)s "
            f"AND emitted_at >= toDateTime64(%(t)s, 3) AND (model = %(m)s OR request_id IN ({canary}))",
            parameters=params,
        ).result_rows[0][0]
        return CanaryHealth(int(requests), int(errors), int(fallbacks), int(anomalies))


@dataclass
class RolloutResult:
    adapter_id: str
    outcome: str  # "promoted" | "rolled_back" | "load_failed"
    reason: str
    stage: int
    share: float

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class AdapterPublisher:
    """Runs one adapter's rollout across servers: load, canary stages, promote or roll back."""

    def __init__(
        self, servers: Sequence[VllmLoraClient], router: CanaryRouter, metrics: MetricsQuery,
        policy: CanaryPolicy, actions: ActionLog, registry: Any = None,
        clock: Callable[[], float] = time.time, sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.servers = list(servers)
        self.router = router
        self.metrics = metrics
        self.policy = policy
        self.actions = actions
        self.registry = registry
        self.clock = clock
        self.sleep = sleep

    def _status(self, adapter_id: str, status: str, share: float, detail: str, action: Any) -> None:
        if self.registry is not None:
            self.registry.set_status(adapter_id, status, share=share, detail=detail, action_id=action.action_id)

    def load(self, adapter_id: str, path: str) -> list[VllmLoraClient]:
        """Load into every server; on any failure unload from those done and raise ``VllmError``."""
        loaded = []
        for server in self.servers:
            try:
                server.load(adapter_id, path)
            except VllmError as exc:
                self.actions.record("adapter.load_failed", adapter_id, outcome="failed",
                                    server=server.base_url, error=str(exc))
                self.unload(adapter_id, loaded)
                raise
            loaded.append(server)
            action = self.actions.record("adapter.loaded", adapter_id, server=server.base_url, path=path)
            self._status(adapter_id, "loaded", 0.0, server.base_url, action)
        return loaded

    def unload(self, adapter_id: str, servers: Sequence[VllmLoraClient] | None = None) -> None:
        for server in self.servers if servers is None else servers:
            try:
                server.unload(adapter_id)
                outcome, error = "ok", ""
            except VllmError as exc:  # keep going: the other servers must still drop it
                outcome, error = "failed", str(exc)
            action = self.actions.record("adapter.unloaded", adapter_id, outcome=outcome,
                                         server=server.base_url, error=error)
            if outcome == "ok":
                self._status(adapter_id, "unloaded", 0.0, server.base_url, action)

    def rollout(self, adapter_id: str, path: str) -> RolloutResult:
        try:
            self.load(adapter_id, path)
        except VllmError as exc:
            return RolloutResult(adapter_id, "load_failed", str(exc), 0, 0.0)
        controller = CanaryController(self.policy)
        decision = controller.start(self.clock())
        self._apply(adapter_id, decision)
        while True:
            self.sleep(self.policy.check_interval)
            now = self.clock()
            health = self.metrics(adapter_id, controller.stage_started)
            decision = controller.observe(health, now)
            self.actions.record(
                "canary.check", adapter_id, outcome=decision.kind, stage=decision.stage,
                share=decision.share, reason=decision.reason, **asdict(health),
            )
            if decision.kind in ("widen", "promote", "rollback"):
                self._apply(adapter_id, decision)
            if decision.kind == "promote":
                return RolloutResult(adapter_id, "promoted", decision.reason, decision.stage, 1.0)
            if decision.kind == "rollback":
                return RolloutResult(adapter_id, "rolled_back", decision.reason, decision.stage, decision.share)

    def _apply(self, adapter_id: str, decision: Decision) -> None:
        if decision.kind == "widen":
            self.router.set_canary(adapter_id, decision.share)
            action = self.actions.record("canary.stage", adapter_id, stage=decision.stage,
                                         share=decision.share, reason=decision.reason)
            self._status(adapter_id, "canary", decision.share, decision.reason, action)
        elif decision.kind == "promote":
            previous = self.router.stable
            self.router.promote(adapter_id)
            action = self.actions.record("canary.promoted", adapter_id, previous=previous, reason=decision.reason)
            self._status(adapter_id, "promoted", 1.0, decision.reason, action)
            if previous != self.router.base_model:
                # Still loaded (a later rollback can route back to it by hand), no longer current.
                self._status(previous, "superseded", 0.0, f"superseded by {adapter_id}", action)
        elif decision.kind == "rollback":
            self.rollback(adapter_id, decision.reason, share=decision.share)

    def rollback(self, adapter_id: str, reason: str, share: float = 0.0,
                 restore_to: tuple[str, str] | None = None) -> None:
        """Route everything back to the stable model first, then unload the adapter everywhere.

        Rolling back the promoted adapter itself routes to ``restore_to`` = (adapter id, folder),
        its parent, when given and loadable on every server, else to the base model (always served).
        """
        if self.router.stable == adapter_id:
            restored = restore_to is not None and self.restore(
                restore_to[0], restore_to[1], f"{adapter_id} rolled back: {reason}")
            if not restored:
                self.router.promote(self.router.base_model)
        self.router.clear_canary()
        action = self.actions.record("canary.rolled_back", adapter_id, outcome="rolled_back", reason=reason,
                                     share_at_rollback=share, now_serving=self.router.stable)
        self._status(adapter_id, "rolled_back", 0.0, reason, action)
        self.unload(adapter_id)

    def restore(self, adapter_id: str, path: str, reason: str) -> bool:
        """Serve ``adapter_id`` (a superseded adapter) as the stable model again: load it on every
        server that does not list it, route all traffic to it, mark it promoted. False (and an
        action) if a server cannot load it; the routing is then unchanged."""
        try:
            for server in self.servers:
                if adapter_id not in server.models():
                    server.load(adapter_id, path)
        except VllmError as exc:
            self.actions.record("adapter.restore_failed", adapter_id, outcome="failed", reason=reason, error=str(exc))
            return False
        previous = self.router.stable
        self.router.promote(adapter_id)
        action = self.actions.record("adapter.restored", adapter_id, reason=reason, previous=previous,
                                     now_serving=adapter_id)
        self._status(adapter_id, "promoted", 1.0, reason, action)
        return True

    def rollback_by_hand(self, adapter_id: str, reason: str, fetch: Callable[[str], str]) -> str:
        """``entroloop adapters rollback``: the router must come from the registry (``from_routing``).
        A promoted adapter hands traffic back to its parent (fetched by ``fetch(id) -> folder`` and
        re-loaded where needed) if the parent was superseded by it, else to the base model; a canary
        is cut off. Returns what now serves the model."""
        restore = None
        share = self.router.share if self.router.canary == adapter_id else 0.0
        if self.registry is not None and self.router.stable == adapter_id:
            parent = self.registry.manifest(adapter_id).parent_adapter
            if parent and self.registry.status(parent) == "superseded":
                restore = (parent, fetch(parent))
        self.rollback(adapter_id, reason, share=share, restore_to=restore)
        return self.router.stable


__all__ = [
    "AdapterPublisher", "CanaryController", "CanaryHealth", "CanaryPolicy", "CanaryRouter",
    "ClickHouseCanaryMetrics", "Decision", "RolloutResult", "VllmError", "VllmLoraClient",
]
