"""The bad-case join's state is bounded (``max_requests``): every audit waits there for a correction
that mostly never comes, so under the TTL alone it grew with all traffic. Above the bound each
watermark drops the longest-idle requests first, counted; what stays joins as before."""

from __future__ import annotations

from entroloop.streams.bad_cases import BadCaseJoiner

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
