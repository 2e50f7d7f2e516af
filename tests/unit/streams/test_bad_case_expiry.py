"""Expiry of the bad-case join by an index on last_seen (``ExpiryIndex``): the same entries expire
as a scan of the whole state would expire, each watermark reads only the expired entries, and
entries that reach the state without the joiner (recovery, rebalance) still expire."""

from __future__ import annotations

from typing import Any

from entroloop.streams.bad_cases import BadCaseJoiner, JoinEntry
from entroloop.streams.join_expiry import ExpiryIndex, TenantExpiryIndex
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from .analytics_records import audit, feedback

CORRECTION = "余额为150.00元"


class ScanningJoiner(BadCaseJoiner):
    """The reference: expiry by scanning every entry (the behaviour before the index)."""

    def on_watermark(self, event_time: float) -> list:
        horizon = event_time - self.ttl_s
        for rid in [rid for rid, entry in self.state.items() if entry.last_seen < horizon]:
            self.expired_unjoined += len(self.state.pop(rid).waiting_feedback)
        return []


class CountingState(dict):  # type: ignore[type-arg]
    """A dict that counts the entries expiry reads: whole-state scans and single lookups."""

    def __init__(self) -> None:
        super().__init__()
        self.scans = 0
        self.lookups = 0

    def items(self) -> Any:
        self.scans += 1
        return super().items()

    def get(self, key: Any, default: Any = None) -> Any:
        self.lookups += 1
        return super().get(key, default)


def _touched_index() -> ExpiryIndex:
    index = ExpiryIndex()
    for key, at in [("a", 5.0), ("b", 1.0), ("c", 3.0), ("d", 9.0)]:
        index.touch(key, at)
    index.touch("b", 8.0)  # seen again: its old time no longer counts
    index.discard("c")
    return index


def test_the_index_yields_keys_last_seen_before_the_horizon_oldest_first_once() -> None:
    index = _touched_index()
    assert index.expired(6.0) == ["a"]
    assert index.expired(6.0) == []
    assert index.expired(100.0) == ["b", "d"] and len(index) == 0


def test_oldest_yields_the_longest_idle_keys_first_and_skips_superseded_times() -> None:
    index = _touched_index()
    assert index.oldest(2) == ["a", "b"]
    assert index.oldest(5) == ["d"] and len(index) == 0


def test_superseded_heap_entries_do_not_pile_up() -> None:
    index = ExpiryIndex()
    for t in range(20_000):
        index.touch("hot", float(t))
    assert len(index._heap) <= 2 * len(index) + 1024
    assert index.expired(19_999.5) == ["hot"]


events = st.lists(
    st.tuples(st.sampled_from(["audit", "feedback", "watermark"]), st.integers(0, 12), st.integers(0, 400)),
    max_size=80,
)


@hsettings(max_examples=150, deadline=None)
@given(events)
def test_the_same_entries_expire_as_with_a_full_scan(steps: list[tuple[str, int, int]]) -> None:
    indexed, scanning = BadCaseJoiner(ttl_s=50), ScanningJoiner(ttl_s=50)
    for kind, n, at in steps:
        for joiner in (indexed, scanning):
            if kind == "audit":
                joiner.process(audit(f"r{n}", response="余额为120.00元", at=float(at)))
            elif kind == "feedback":
                joiner.process(feedback(f"r{n}", corrected=CORRECTION, at=float(at)))
            else:
                joiner.on_watermark(float(at))
        assert set(indexed.state) == set(scanning.state)
        assert indexed.expired_unjoined == scanning.expired_unjoined


def test_a_watermark_reads_only_the_expired_entries() -> None:
    state = CountingState()
    joiner = BadCaseJoiner(ttl_s=100, state=state)
    for n in range(5000):
        joiner.process(audit(f"r{n}", at=1000.0 + n))
    joiner.on_watermark(1050.0)  # the first one indexes what the state holds: one scan (the next one ttl later)
    state.scans = state.lookups = 0
    for t in range(1101, 1104):  # each expires one entry
        joiner.on_watermark(float(t))
    assert (state.scans, state.lookups) == (0, 3)
    assert len(state) == 4997 and "r3" in state and "r2" not in state


def test_entries_that_came_without_the_joiner_expire_too() -> None:
    state: dict[str, JoinEntry] = {"recovered": JoinEntry(audit=audit("recovered", at=1000.0), last_seen=1000.0)}
    joiner = BadCaseJoiner(ttl_s=100, state=state)
    joiner.process(audit("young", at=1040.0))
    joiner.on_watermark(1050.0)  # "recovered" was never processed: the first watermark indexes it
    # a rebalance swaps a key for another of the same count: the index cannot tell from the size
    del state["young"]
    state["swapped"] = JoinEntry(last_seen=1010.0)
    joiner.on_watermark(1120.0)
    assert "recovered" not in state and "swapped" in state  # not indexed yet
    joiner.on_watermark(1150.0)  # one ttl after the last full scan: indexed and expired
    assert state == {}


def _tenant_index(held: dict[str, int]) -> TenantExpiryIndex:
    index = TenantExpiryIndex()
    for tenant, n in held.items():
        for i in range(n):
            index.touch(f"{tenant}{i}", tenant, float(i))
    return index


def test_eviction_cuts_the_largest_tenants_to_one_level_oldest_first() -> None:
    index = _tenant_index({"A": 10, "B": 10, "C": 2})
    dropped = index.evict(3)
    assert sorted(dropped) == ["A0", "B0", "B1"]  # two tied tenants share the cut, each its oldest
    assert index.held() == {"A": 9, "B": 8, "C": 2}
    # 14 more: A and B down to C's size (13) are not enough, so all three to one level (2, 2, 1)
    assert sorted(index.evict(14)) == sorted([f"A{i}" for i in range(1, 8)] + [f"B{i}" for i in range(2, 8)] + ["C0"])
    assert index.held() == {"A": 2, "B": 2, "C": 1}
    assert len(index.evict(100)) == 5 and len(index) == 0 and index.held() == {}  # asked for more than held


def test_expiry_spans_every_tenant() -> None:
    index = _tenant_index({"A": 5, "B": 5})
    assert sorted(index.expired(2.0)) == ["A0", "A1", "B0", "B1"]
    assert index.held() == {"A": 3, "B": 3}
