"""Adapter routing on live traffic: the gateway's read-only view of the registry's routing state.

The publisher (``training/publisher.py``) and ``entroloop adapters rollback`` write every canary
stage, promotion and rollback to ClickHouse's append-only ``adapter_status`` table. ``RoutingTable``
re-reads that state every ``refresh_s`` seconds (``entroloop.infra.adapter_routing.read_routings``, the
same query the registry uses) and answers, per request, which served model name to send upstream:
the base model, its promoted adapter, or, for a sticky share of users, the canary adapter. vLLM
serves a loaded LoRA adapter under its adapter name, so rewriting ``model`` is all it takes.

Routing must never fail a request: until the first read succeeds, and whenever ClickHouse cannot be
reached, the last known state is used (logged once per outage, not per refresh).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

from entroloop.infra.adapter_routing import AdapterRouting, read_routings

log = logging.getLogger(__name__)


class RoutingTable:
    """Every base model's ``AdapterRouting``, refreshed from ClickHouse; thread-safe to read."""

    def __init__(self, connect: Callable[[], Any], database: str, refresh_s: float = 10.0) -> None:
        """``connect()`` returns a clickhouse-connect client; it is called lazily and again after a
        failure, so a gateway started before ClickHouse still picks routing up later."""
        self._connect = connect
        self.database = database
        self.refresh_s = refresh_s
        self._client: Any = None
        self._routings: dict[str, AdapterRouting] = {}
        self._lock = threading.Lock()  # one refresh at a time (a clickhouse client is not re-entrant)
        self._unreachable = False
        self.refreshes = 0  # successful reads so far
        self.failures = 0  # failed reads so far

    @classmethod
    def from_settings(cls, settings: Any) -> RoutingTable:
        from entroloop.infra.clickhouse.client import connect

        dsn, password = settings.resolved_clickhouse_dsn(), settings.clickhouse_password.get_secret_value()
        if dsn.startswith("chdb://"):
            # chDB opens a folder in one process only: the gateway would hold it (or never get it)
            log.warning("entroloop gateway: adapter routing reads the embedded ClickHouse %s; chDB allows one "
                        "process per folder, so use a ClickHouse server (ENTROLOOP_CLICKHOUSE_DSN=http://...) "
                        "when a sink or trainer runs too", dsn)
        return cls(lambda: connect(dsn, password), settings.clickhouse_database, settings.gateway_routing_refresh_s)

    @property
    def routings(self) -> dict[str, AdapterRouting]:
        """The current state (a snapshot: replaced whole by each refresh, never mutated)."""
        return self._routings

    def route(self, model: str, key: str) -> tuple[str, AdapterRouting | None]:
        """(model name to send upstream, the routing applied) for a request naming ``model``.

        Only a base model with routing state is routed; an adapter named by the client, or a model
        the registry knows nothing of, goes upstream as named (routing ``None``)."""
        routing = self._routings.get(model)
        if routing is None:
            return model, None
        return routing.choose(key), routing

    def refresh(self) -> bool:
        """Read the state once (blocking); on failure keep the last known state. True if read."""
        with self._lock:
            try:
                if self._client is None:
                    self._client = self._connect()
                routings = read_routings(self._client, self.database)
            except Exception as exc:  # noqa: BLE001 - any ClickHouse/driver error: keep serving
                self.failures += 1
                self._client = None  # reconnect next time (a server restart, a chDB folder freed)
                if not self._unreachable:
                    self._unreachable = True
                    log.warning("entroloop gateway: adapter routing not refreshed (%s); keeping the last known "
                                "state (%d models) until ClickHouse answers again", exc, len(self._routings))
                return False
            if self._unreachable:
                self._unreachable = False
                log.warning("entroloop gateway: adapter routing refreshed again from ClickHouse")
            self._routings = routings
            self.refreshes += 1
            return True

    async def run(self) -> None:
        """Refresh every ``refresh_s`` seconds until cancelled (off the event loop: reads block)."""
        while True:
            await asyncio.to_thread(self.refresh)
            await asyncio.sleep(self.refresh_s)


__all__ = ["RoutingTable"]
