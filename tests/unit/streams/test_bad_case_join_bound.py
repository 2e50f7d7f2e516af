"""The bad-case join's state is bounded (``max_requests``): every audit waits there for a correction
that mostly never comes, so under the TTL alone it grew with all traffic. Above the bound each
watermark drops the longest-idle requests of the tenant holding the most, counted; what stays
joins as before."""

from __future__ import annotations

from entroloop.streams.bad_cases import BadCaseJoiner, JoinEntry

from entroloop.contract.records import BadCase
from entroloop.contract.settings import Settings

from .analytics_records import audit, feedback

RESPONSE, CORRECTION = "余额为100.00元", "余额为150.00元"


def test_above_the_bound_the_longest_idle_requests_are_dropped_and_counted() -> None:
    joiner = BadCaseJoiner(max_requests=100)
    for i in range(300):
        joiner.process(audit(f"r{i}", response=RESPONSE, at=1000.0 + i))
    joiner.process(audit("r5", response=RESPONSE, at=1300.0))  # an old request seen again: kept
    joiner.process(feedback("waiting", corrected=CORRECTION, at=1000.5))  # before its audit, long idle
    assert len(joiner.state) == 301
    assert joiner.on_watermark(1301.0) == []
    assert len(joiner.state) == 100 and joiner.evicted == 201
    assert set(joiner.state) == {"r5"} | {f"r{i}" for i in range(201, 300)}
    assert joiner.expired_unjoined == 1  # the correction that waited for an audit is counted, not kept

    kept = joiner.process(feedback("r250", corrected=CORRECTION, at=1302.0))
    assert [type(c) for c in kept] == [BadCase] and kept[0].request_id == "r250"
    assert joiner.process(feedback("r10", corrected=CORRECTION, at=1302.0)) == []  # its answer was dropped
    joiner.on_watermark(1303.0)
    assert len(joiner.state) == 100 and "r10" in joiner.state  # the waiting correction is the newest now


def test_under_the_bound_nothing_is_dropped_before_its_ttl() -> None:
    joiner = BadCaseJoiner(max_requests=1000, ttl_s=50.0)
    audits = [audit(f"r{i}", at=1000.0 + i) for i in range(300)]
    for a in audits:
        joiner.process(a)
    joiner.on_watermark(1300.0)
    assert joiner.evicted == 0  # only the TTL expired some
    assert set(joiner.state) == {a.request_id for a in audits if a.emitted_at >= 1250.0}
    assert 40 < len(joiner.state) < 300


def test_the_bound_comes_from_the_settings() -> None:
    joiner = BadCaseJoiner.from_settings(Settings(badcase_join_max_requests=7))
    assert joiner.max_requests == 7
    assert BadCaseJoiner.from_settings(Settings()).max_requests == 200_000


def test_a_tenant_flooding_the_join_drops_its_own_answers_not_the_others() -> None:
    """Attack (or a noisy neighbour): tenant A sends a burst of 500 requests after tenant B's 20.
    Dropping the longest idle across tenants would push all of B's answers out, and B's users'
    corrections would stop joining; the bound takes from the tenant holding the most instead."""
    joiner = BadCaseJoiner(max_requests=100)
    for i in range(20):
        joiner.process(audit(f"b{i}", response=RESPONSE, at=1000.0 + i, tenant="B"))
    for i in range(500):
        joiner.process(audit(f"a{i}", response=RESPONSE, at=1100.0 + i * 0.1, tenant="A"))
    joiner.on_watermark(1200.0)
    assert len(joiner.state) == 100 and joiner.evicted == 420
    assert {rid for rid in joiner.state if rid.startswith("b")} == {f"b{i}" for i in range(20)}
    assert {rid for rid in joiner.state if rid.startswith("a")} == {f"a{i}" for i in range(420, 500)}  # A's newest
    joined = joiner.process(feedback("b0", corrected=CORRECTION, at=1201.0, tenant="B"))  # B's oldest answer
    assert [type(c) for c in joined] == [BadCase]


def test_tenants_above_their_share_are_cut_to_the_same_size_longest_idle_first() -> None:
    joiner = BadCaseJoiner(max_requests=90)
    held = {"A": 80, "B": 50, "C": 10}
    for tenant, n in held.items():
        for i in range(n):
            joiner.process(audit(f"{tenant}{i}", at=1000.0 + i, tenant=tenant))
    joiner.on_watermark(1100.0)  # 140 held, 50 to drop: A down to B's size (30), then both in turn (10 each)
    left = {tenant: sorted(int(rid[1:]) for rid in joiner.state if rid[0] == tenant) for tenant in held}
    assert {t: len(ids) for t, ids in left.items()} == {"A": 40, "B": 40, "C": 10}
    assert left["A"] == list(range(40, 80)) and left["B"] == list(range(10, 50))  # the newest of each kept


def test_a_correction_waiting_for_its_answer_counts_for_the_answers_tenant_once_it_comes() -> None:
    """Before its audit a request is held for the correction's tenant; the answer names the owner."""
    joiner = BadCaseJoiner(max_requests=3)
    joiner.process(feedback("x", corrected=CORRECTION, at=1000.0, tenant="A"))
    assert joiner._expiry.held() == {"A": 1}
    joiner.process(audit("x", response=RESPONSE, at=1001.0, tenant="B"))  # A's correction: a tenant_mismatch
    assert joiner._expiry.held() == {"B": 1}
    for i in range(3):
        joiner.process(audit(f"a{i}", at=1002.0 + i, tenant="A"))
    joiner.on_watermark(1010.0)
    assert set(joiner.state) == {"x", "a1", "a2"}  # A held the most: its oldest went


def test_recovered_entries_are_grouped_by_tenant_before_the_bound_applies() -> None:
    """Entries that reach the state without passing through ``process`` (a changelog recovery)."""
    state = {}
    for i in range(50):
        state[f"a{i}"] = JoinEntry(audit=audit(f"a{i}", at=1000.0 + i, tenant="A"), last_seen=1000.0 + i)
    for i in range(5):
        state[f"b{i}"] = JoinEntry(audit=audit(f"b{i}", at=900.0 + i, tenant="B"), last_seen=900.0 + i)
    joiner = BadCaseJoiner(max_requests=20, state=state)
    joiner.on_watermark(1100.0)
    assert sorted(rid for rid in state if rid.startswith("b")) == [f"b{i}" for i in range(5)]
    assert len(state) == 20 and joiner.evicted == 35
