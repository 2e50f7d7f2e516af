"""An audit too large for one record arrives in parts (``Audit.part_index`` / ``part_count``): it
is still one request to the processors that count requests or join on the answer."""

from __future__ import annotations

from entroloop.streams.bad_cases import BadCaseJoiner
from entroloop.streams.fallback_rates import FallbackRateMonitor
from entroloop.streams.retrain_triggers import RetrainTrigger

from entroloop.contract.records import BadCase, Health

from .analytics_records import audit, feedback

T0 = 6000.0


def _parts(request_id: str, count: int = 3):
    return [audit(request_id, prompt=f"q{i}", response=f"answer part {i}", at=T0, part_index=i, part_count=count)
            for i in range(count)]


def test_fallback_rate_counts_a_request_in_parts_once() -> None:
    mon = FallbackRateMonitor(grace_s=0)
    for record in _parts("r1") + [audit("r2", at=T0)]:
        mon.process(record)
    closed = [r for r in mon.on_watermark(T0 + 60) if isinstance(r, Health) and r.metric == "fallback_rate_1m"]
    assert closed and all(int(r.labels["requests"]) == 2 for r in closed)


def test_retrain_trigger_counts_a_request_in_parts_once() -> None:
    trig = RetrainTrigger(bad_case_count=10**9, min_requests=1)
    for record in _parts("r1"):
        trig.process(record)
    assert sum(trig.requests.values()) == 1


def test_bad_case_joins_the_first_part_once() -> None:
    joiner = BadCaseJoiner()
    out = [r for record in _parts("r1") for r in joiner.process(record)]
    out += joiner.process(feedback("r1", corrected="a corrected answer", rating=1, at=T0 + 1))
    cases = [r for r in out if isinstance(r, BadCase)]
    assert len(cases) == 1
    assert cases[0].response == "answer part 0"
