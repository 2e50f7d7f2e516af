"""Which join entries to drop: by idle time (the TTL) and, above the bound, from the tenant holding most.

The bad-case join keeps every answer of every tenant for a while, waiting for a correction, under one
bound on its size (``BadCaseJoiner.max_requests``). Dropping the longest-idle requests across all
tenants would let one tenant's burst of traffic push every other tenant's answers out, so their
corrections stop joining: ``TenantExpiryIndex`` drops from the tenant that holds the most requests,
longest-idle first, so a tenant within its fair share keeps its answers while another floods.
Both indexes pop only what they drop; neither scans the state.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable


class ExpiryIndex:
    """Keys by the time they were last seen: ``expired(horizon)`` yields the keys last seen before
    ``horizon`` in O(expired · log n), not O(n).

    A heap of (last_seen, key) with lazy deletion: ``touch`` pushes a key again when its time
    changes, and the entry it supersedes is skipped when it surfaces (``_current`` knows each key's
    time); the heap is rebuilt when the superseded entries outnumber the live ones."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, str]] = []
        self._current: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self._current)

    def __contains__(self, key: object) -> bool:
        return key in self._current

    def touch(self, key: str, last_seen: float) -> None:
        if self._current.get(key) == last_seen:
            return
        self._current[key] = last_seen
        heapq.heappush(self._heap, (last_seen, key))
        if len(self._heap) > 2 * len(self._current) + 1024:
            self._rebuild()

    def discard(self, key: str) -> None:
        self._current.pop(key, None)  # its heap entry is skipped when it surfaces

    def expired(self, horizon: float) -> list[str]:
        """Remove and return every key last seen before ``horizon``, oldest first."""
        return self._pop(horizon, len(self._current))

    def oldest(self, count: int) -> list[str]:
        """Remove and return the ``count`` keys last seen longest ago, oldest first."""
        return self._pop(float("inf"), count)

    def _pop(self, horizon: float, count: int) -> list[str]:
        heap, current, out = self._heap, self._current, []
        while heap and heap[0][0] < horizon and len(out) < count:
            last_seen, key = heapq.heappop(heap)
            if current.get(key) == last_seen:  # else superseded by a later touch, or discarded
                del current[key]
                out.append(key)
        return out

    def reset(self, items: Iterable[tuple[str, float]]) -> None:
        self._current = dict(items)
        self._rebuild()

    def _rebuild(self) -> None:
        self._heap = [(last_seen, key) for key, last_seen in self._current.items()]
        heapq.heapify(self._heap)


class TenantExpiryIndex:
    """``ExpiryIndex`` per tenant: ``expired`` over all tenants, ``evict`` from the largest down."""

    def __init__(self) -> None:
        self._by_tenant: dict[str, ExpiryIndex] = {}

    def __len__(self) -> int:
        return sum(len(index) for index in self._by_tenant.values())

    def held(self) -> dict[str, int]:
        """Keys indexed per tenant."""
        return {tenant: len(index) for tenant, index in self._by_tenant.items() if len(index)}

    def touch(self, key: str, tenant: str, last_seen: float) -> None:
        index = self._by_tenant.get(tenant)
        if index is None:
            index = self._by_tenant[tenant] = ExpiryIndex()
        index.touch(key, last_seen)

    def discard(self, key: str, tenant: str) -> None:
        if (index := self._by_tenant.get(tenant)) is not None:
            index.discard(key)

    def expired(self, horizon: float) -> list[str]:
        """Remove and return every key last seen before ``horizon`` (oldest first per tenant)."""
        out = [key for index in self._by_tenant.values() for key in index.expired(horizon)]
        self._forget_empty()
        return out

    def evict(self, count: int) -> list[str]:
        """Remove and return ``count`` keys (fewer if fewer are held): the tenants holding the most are
        cut down to one level, each losing its longest-idle keys, and the rest keep all of theirs."""
        out = [key for tenant, cut in self._cuts(count).items() for key in self._by_tenant[tenant].oldest(cut)]
        self._forget_empty()
        return out

    def _cuts(self, count: int) -> dict[str, int]:
        """How many keys each tenant loses so that ``count`` go, taken from the largest down to a level."""
        order = sorted(((tenant, len(index)) for tenant, index in self._by_tenant.items()),
                       key=lambda held: (-held[1], held[0]))
        held = 0
        for k, (_, size) in enumerate(order, 1):
            held += size
            next_size = order[k][1] if k < len(order) else 0
            if held - k * next_size >= count:  # cutting the k largest down to the next one's size is enough
                level, extra = divmod(held - count, k)  # each keeps ``level``; ``extra`` of them one more
                return {tenant: size - level - (i < extra) for i, (tenant, size) in enumerate(order[:k])}
        return dict(order)  # asked for everything

    def reset(self, items: Iterable[tuple[str, str, float]]) -> None:
        """Index exactly ``(key, tenant, last_seen)`` items (the state as recovered)."""
        grouped: dict[str, list[tuple[str, float]]] = {}
        for key, tenant, last_seen in items:
            grouped.setdefault(tenant, []).append((key, last_seen))
        self._by_tenant = {}
        for tenant, keyed in grouped.items():
            self._by_tenant[tenant] = index = ExpiryIndex()
            index.reset(keyed)

    def _forget_empty(self) -> None:
        for tenant in [t for t, index in self._by_tenant.items() if not len(index)]:
            del self._by_tenant[tenant]


__all__ = ["ExpiryIndex", "TenantExpiryIndex"]
