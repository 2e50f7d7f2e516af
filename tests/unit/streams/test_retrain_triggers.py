"""RetrainTrigger: count and rate conditions, window boundaries, one request per key."""

from __future__ import annotations

from entroloop.streams.retrain_triggers import RetrainTrigger
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from entroloop.contract.records import RetrainRequest

from .analytics_records import audit, bad_case

H0 = 7200.0  # an hour boundary


def _requests(out: list) -> list[RetrainRequest]:
    return [r for r in out if isinstance(r, RetrainRequest)]


def test_count_trigger_fires_on_the_nth_high_confidence_bad_case() -> None:
    trig = RetrainTrigger(bad_case_count=3, min_requests=10**9)
    out = []
    for i in range(2):
        out += trig.process(bad_case(f"b{i}", ["numbers"], confidence=0.9, at=H0 + i))
    out += trig.process(bad_case("low", ["numbers"], confidence=0.5, at=H0 + 5))  # not high
    assert out == []
    (req,) = trig.process(bad_case("b2", ["numbers", "regression"], confidence=0.8, at=H0 + 10))
    assert req.category == "numbers" and req.model == "m" and req.adapter == "a1"
    assert req.trigger_key == f"m|a1|numbers|{H0:.0f}+3600"
    assert (req.window_start, req.window_end) == (H0, H0 + 3600) and req.bad_case_count == 4
    assert "high-confidence" in req.reason


def test_never_two_requests_for_the_same_key() -> None:
    trig = RetrainTrigger(bad_case_count=2, min_requests=1, error_rate=0.05)
    trig.process(audit("a", adapter="a1", at=H0))
    emitted = []
    for i in range(10):
        emitted += trig.process(bad_case(f"b{i}", ["numbers"], at=H0 + i))
    emitted += trig.on_watermark(H0 + 7200)  # the close-time rate check finds the key taken
    assert len(_requests(emitted)) == 1


def test_redelivered_bad_case_counts_once() -> None:
    trig = RetrainTrigger(bad_case_count=2, min_requests=10**9)
    case = bad_case("b", ["dates"], at=H0)
    assert trig.process(case) == [] and trig.process(case) == []


def test_rate_trigger_needs_min_requests_and_rate_above_threshold() -> None:
    trig = RetrainTrigger(error_rate=0.05, min_requests=100, bad_case_count=10**9)
    for i in range(100):
        trig.process(audit(f"a{i}", adapter="a1", at=H0 + i))
    out = []
    for i in range(5):  # 5 % exactly: not above
        out += trig.process(bad_case(f"b{i}", ["units"], confidence=0.1, at=H0 + 200))
    assert out == []
    (req,) = trig.process(bad_case("b5", ["units"], confidence=0.1, at=H0 + 201))
    assert "error rate 6.00%" in req.reason


def test_rate_checked_at_window_close_when_requests_arrive_after_bad_cases() -> None:
    trig = RetrainTrigger(error_rate=0.05, min_requests=100, bad_case_count=10**9, grace_s=0)
    for i in range(10):
        trig.process(bad_case(f"b{i}", ["dates"], confidence=0.1, at=H0 + 1))
    for i in range(100):
        trig.process(audit(f"a{i}", adapter="a1", at=H0 + 3599))
    assert trig.on_watermark(H0 + 3599.9) == []
    (req,) = _requests(trig.on_watermark(H0 + 3600))
    assert req.category == "dates" and req.bad_case_count == 10


def test_window_boundary_splits_counts() -> None:
    trig = RetrainTrigger(bad_case_count=2, min_requests=10**9)
    assert trig.process(bad_case("b0", ["numbers"], at=H0 + 3599.999)) == []
    assert trig.process(bad_case("b1", ["numbers"], at=H0 + 3600.0)) == []  # next hour
    (req,) = trig.process(bad_case("b2", ["numbers"], at=H0 + 3601.0))
    assert req.window_start == H0 + 3600


def test_categories_models_adapters_are_separate_keys() -> None:
    trig = RetrainTrigger(bad_case_count=1, min_requests=10**9)
    out = []
    out += trig.process(bad_case("b0", ["numbers", "units"], at=H0))
    out += trig.process(bad_case("b1", ["numbers"], adapter="a2", at=H0))
    out += trig.process(bad_case("b2", ["numbers"], model="m2", at=H0))
    keys = [r.trigger_key for r in _requests(out)]
    assert len(keys) == len(set(keys)) == 4


def test_late_bad_case_for_a_closed_window_is_dropped() -> None:
    trig = RetrainTrigger(bad_case_count=1, grace_s=0)
    trig.on_watermark(H0 + 3600)
    assert trig.process(bad_case("late", ["numbers"], at=H0 + 10)) == []
    assert trig.late_events == 1


@hsettings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["numbers", "units", "dates"]),
                          st.floats(min_value=0, max_value=4 * 3600),
                          st.booleans()), max_size=80),
       st.integers(min_value=1, max_value=5))
def test_property_trigger_keys_are_unique(events: list, threshold: int) -> None:
    trig = RetrainTrigger(bad_case_count=threshold, min_requests=1, error_rate=0.0, grace_s=0)
    out = []
    for i, (category, offset, dup) in enumerate(sorted(events, key=lambda e: e[1])):
        case = bad_case(f"b{i}", [category], at=H0 + offset)
        out += trig.process(case)
        if dup:
            out += trig.process(case)
        out += trig.on_watermark(H0 + offset - 7200)
    out += trig.on_watermark(H0 + 10 * 3600)
    keys = [r.trigger_key for r in _requests(out)]
    assert len(keys) == len(set(keys))


def _counted(trig: RetrainTrigger, records: list) -> int:
    """Bad cases counted in the window of H0 after ``records``."""
    for record in records:
        trig.process(record)
    return sum(counts[0] for key, counts in trig.bad_cases.items() if key[3] == H0)


def test_a_snapshot_keeps_an_open_hour_of_bad_cases_in_9_bytes_each() -> None:
    """The snapshot is one broker record (1 MB): ids as strings cost ~47 bytes a bad case there,
    so an hour at 6 bad cases a second no longer fit."""
    trig = RetrainTrigger(bad_case_count=10**9, min_requests=10**9)
    assert _counted(trig, [bad_case(f"r{i}", ["numbers"], at=H0 + i * 0.05) for i in range(20_000)]) == 20_000
    per_bad_case = len(trig.snapshot()) / 20_000
    assert 8.0 <= per_bad_case <= 9.5, per_bad_case


def test_a_restored_trigger_does_not_count_a_redelivered_bad_case_twice() -> None:
    cases = [bad_case(f"r{i}", ["numbers"], at=H0 + i) for i in range(50)]
    before = RetrainTrigger(bad_case_count=10**9, min_requests=10**9)
    assert _counted(before, cases[:30]) == 30
    after = RetrainTrigger(bad_case_count=10**9, min_requests=10**9)
    after.restore(before.snapshot())
    assert _counted(after, cases) == 50  # 0..29 delivered again: counted once


def test_a_snapshot_written_with_event_ids_is_read_and_still_deduplicates() -> None:
    """Snapshots of the version before fingerprints kept the ids themselves; a worker upgraded
    mid-hour reads them instead of starting the hour's counts afresh."""
    import msgspec

    cases = [bad_case(f"r{i}", ["numbers"], at=H0 + i) for i in range(10)]
    before = RetrainTrigger(bad_case_count=10**9, min_requests=10**9)
    _counted(before, cases[:6])
    fields = msgspec.msgpack.decode(before.snapshot())
    fields[3] = {c.event_id: H0 + 3600 for c in cases[:6]}  # the old layout: event id -> window end
    after = RetrainTrigger(bad_case_count=10**9, min_requests=10**9)
    after.restore(msgspec.msgpack.encode(fields))
    assert _counted(after, cases) == 10
