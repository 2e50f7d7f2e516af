"""Which model serves a request: the base model, its promoted LoRA adapter, or a canary adapter.

Shared by ``training/`` (the publisher's ``CanaryRouter`` and ``AdapterRegistry.routing``) and
``collectors/gateway/`` (the serving path), so both make the same decision from the same state:

* ``AdapterRouting`` is one base model's routing state: the promoted adapter ("" = the base model
  itself), the canary adapter ("" = none) and the canary's share of traffic;
* ``AdapterRouting.choose(key)`` is sticky: a key (user or request id) has a fixed position in
  [0, 1) (``bucket``), and the canary serves the keys below its share. The position does not depend
  on the adapter, so widening a canary from 3% to 30% keeps the first 3% of users on it;
* ``read_routings`` rebuilds the state of every base model from ClickHouse's append-only
  ``adapter_status`` history (migration 0003). This is the only copy of that query: the registry,
  ``entroloop adapters rollback`` and the gateway all read routing through it.

No import of training/ or of any ML package: the gateway imports this module.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, replace
from typing import Any


def bucket(key: str) -> float:
    """A key's fixed position in [0, 1): the same key always routes the same way."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big") / 2**64


@dataclass(frozen=True)
class AdapterRouting:
    """One base model's routing state (immutable: a change is a new state)."""

    model: str  # the base model's served name: what serves when no adapter is promoted
    stable: str = ""  # the promoted adapter ("" = the base model)
    canary: str = ""  # the canary adapter ("" = none)
    share: float = 0.0  # the canary's share of keys, in [0, 1]

    @property
    def served_stable(self) -> str:
        """What serves every key outside the canary's share."""
        return self.stable or self.model

    def choose(self, key: str) -> str:
        """The served model name for ``key``: the canary for a sticky ``share`` of keys, else stable."""
        if self.canary and bucket(key) < self.share:
            return self.canary
        return self.served_stable

    def with_canary(self, adapter: str, share: float) -> AdapterRouting:
        return replace(self, canary=adapter, share=min(max(float(share), 0.0), 1.0))

    def promoted(self, adapter: str) -> AdapterRouting:
        """``adapter`` serves everything (the base model's own name means no adapter); no canary."""
        return replace(self, stable="" if adapter == self.model else adapter, canary="", share=0.0)

    def without_canary(self) -> AdapterRouting:
        return replace(self, canary="", share=0.0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, routing: dict[str, Any], model: str | None = None) -> AdapterRouting:
        """From ``to_dict``'s shape; ``model`` renames the base model (its served name)."""
        state = cls(model if model is not None else str(routing.get("model") or ""),
                    stable=str(routing.get("stable") or ""))
        if routing.get("canary"):
            state = state.with_canary(str(routing["canary"]), float(routing.get("share") or 0.0))
        return state


def _routing_sql(database: str, one_model: bool) -> str:
    """Every adapter's latest status, with its base model, oldest change first.

    ``adapter_status`` is append-only, so an adapter's state is the row with the latest ``at``;
    ``adapters`` is a ReplacingMergeTree that may hold a retried registration twice before a merge,
    hence DISTINCT.
    """
    where = "WHERE a.model = %(m)s" if one_model else ""
    return (
        f"SELECT a.model, s.adapter_id, s.status, s.share FROM ("
        f"SELECT adapter_id, argMax(status, at) AS status, argMax(share, at) AS share, max(at) AS changed "
        f"FROM {database}.adapter_status GROUP BY adapter_id) AS s "
        f"INNER JOIN (SELECT DISTINCT adapter_id, model FROM {database}.adapters) AS a "
        f"ON a.adapter_id = s.adapter_id {where} ORDER BY s.changed, s.adapter_id"
    )


def routings_from_rows(rows: list[tuple[Any, ...]] | list[list[Any]]) -> dict[str, AdapterRouting]:
    """Fold (model, adapter id, latest status, share) rows, oldest change first, into each model's
    routing: the most recently promoted adapter is stable, the most recent canary is the canary."""
    routings: dict[str, AdapterRouting] = {}
    for model, adapter_id, status, share in rows:
        state = routings.get(model) or AdapterRouting(str(model))
        if status == "promoted":
            state = replace(state, stable=str(adapter_id))
        elif status == "canary":
            # share is Float32 in ClickHouse: rounded back to what was written
            state = state.with_canary(str(adapter_id), round(float(share), 6))
        routings[model] = state
    return routings


def read_routings(client: Any, database: str, model: str | None = None) -> dict[str, AdapterRouting]:
    """The routing of every base model that has adapters (only ``model`` when given), from ClickHouse.

    Keys and ``AdapterRouting.model`` are the model names the adapters were registered for (the
    served base model name); a model with adapters none of which is promoted or canary routes to
    itself.
    """
    rows = client.query(_routing_sql(database, model is not None),
                        parameters={"m": model} if model is not None else None).result_rows
    routings = routings_from_rows(rows)
    if model is not None:
        routings.setdefault(model, AdapterRouting(model))
    return routings


__all__ = ["AdapterRouting", "bucket", "read_routings", "routings_from_rows"]
