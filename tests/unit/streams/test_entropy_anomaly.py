"""Loop and gibberish rules on hand-built entropy sequences, including the run-length boundaries."""

from __future__ import annotations

import numpy as np
import pytest
from entroloop.streams.entropy_anomaly import (
    EntropyAnomalyDetector,
    EntropyCarry,
    decode_carry,
)
from entroloop.streams.table_state import TableState
from hypothesis import given, settings
from hypothesis import strategies as st

from entroloop.contract.codec import decode
from entroloop.contract.ids import NodeStamper
from entroloop.contract.records import Alert, DeadLetter, TokenEntropy, pack_entropies

from .test_table_state import FakeTable

stamper = NodeStamper("node-t")
NORMAL = 3.0


def tokens(values, request_id="r1", **kw) -> TokenEntropy:
    return TokenEntropy(**stamper.stamp(), request_id=request_id, model="m", entropies=pack_entropies(values), **kw)


def spans(alerts: list[Alert]) -> list[tuple[str, int, int]]:
    return [(a.rule, a.token_start, a.token_end) for a in alerts]


def runs_by_hand(values, below, threshold, min_run):
    """The obvious loop, to check the vectorised batch implementation against."""
    found, start = [], None
    for i, v in enumerate([*values, None]):
        inside = v is not None and (v < threshold if below else v > threshold)
        if inside and start is None:
            start = i
        elif not inside and start is not None:
            if i - start >= min_run:
                found.append((start, i))
            start = None
    return found


@settings(max_examples=150, deadline=None)
@given(st.lists(st.lists(st.sampled_from([0.3, 1.4, 1.6, 3.0, 4.4, 4.6, 6.0]), max_size=40), min_size=1, max_size=8))
def test_batch_finds_exactly_the_runs_a_plain_loop_finds(sequences):
    records = [tokens(seq, request_id=f"r{i}") for i, seq in enumerate(sequences)]
    got = spans_by_request(EntropyAnomalyDetector().process_batch(records))
    expected = {}
    for i, seq in enumerate(sequences):
        f16 = [float(np.float16(v)) for v in seq]
        runs = [("repetition_loop", *r) for r in runs_by_hand(f16, True, 1.5, 5)]
        runs += [("gibberish", *r) for r in runs_by_hand(f16, False, 4.5, 5)]
        if runs:
            expected[f"r{i}"] = sorted(runs)
    assert got == expected


def spans_by_request(alerts):
    out = {}
    for a in alerts:
        out.setdefault(a.request_id, []).append((a.rule, a.token_start, a.token_end))
    return {k: sorted(v) for k, v in out.items()}


@pytest.mark.parametrize("run, expected", [(4, []), (5, [("repetition_loop", 10, 15)]), (6, [("repetition_loop", 10, 16)])])
def test_loop_needs_min_run_consecutive_tokens(run, expected):
    values = [NORMAL] * 10 + [0.5] * run + [NORMAL] * 10
    assert spans(EntropyAnomalyDetector().process(tokens(values))) == expected


def test_threshold_is_strict():
    values = [NORMAL] * 3 + [1.5] * 10 + [4.5] * 10  # exactly at the thresholds: not anomalous
    assert EntropyAnomalyDetector().process(tokens(values)) == []


def test_gibberish_run_and_runs_at_both_edges():
    values = [5.2] * 6 + [NORMAL] * 5 + [0.2] * 7
    assert spans(EntropyAnomalyDetector().process(tokens(values))) == [
        ("repetition_loop", 11, 18),
        ("gibberish", 0, 6),
    ]


def test_isolated_dips_and_spikes_are_normal():
    values = [NORMAL, 0.1, NORMAL, 0.1, 0.1, NORMAL, 5.5, NORMAL, 6.0, 6.0, 6.0, 6.0, NORMAL]
    assert EntropyAnomalyDetector().process(tokens(values)) == []


def test_configurable_thresholds():
    detector = EntropyAnomalyDetector(loop_threshold=2.0, loop_min_run=3)
    assert spans(detector.process(tokens([NORMAL, 1.8, 1.8, 1.8, NORMAL]))) == [("repetition_loop", 1, 4)]


def test_loop_spanning_chunks_is_one_alert_with_absolute_positions():
    detector = EntropyAnomalyDetector()
    first = tokens([NORMAL] * 8 + [0.3] * 3, chunk_index=0, first_token_index=0, final=False)
    second = tokens([0.3] * 4 + [NORMAL] * 4, chunk_index=1, first_token_index=11, final=True)
    assert detector.process(first) == []
    assert spans(detector.process(second)) == [("repetition_loop", 8, 15)]


def test_run_ending_exactly_at_chunk_boundary_is_reported_by_next_chunk():
    detector = EntropyAnomalyDetector()
    detector.process(tokens([NORMAL] * 2 + [0.3] * 6, chunk_index=0, final=False))
    assert spans(detector.process(tokens([NORMAL] * 4, chunk_index=1, first_token_index=8))) == [("repetition_loop", 2, 8)]


def test_alerts_carry_span_rule_baseline_and_deterministic_ids():
    record = tokens([NORMAL] * 5 + [0.4] * 8)
    a1 = EntropyAnomalyDetector().process(record)
    a2 = EntropyAnomalyDetector().process(record)
    assert a1 == a2  # reprocessing yields identical records (idempotent sinks absorb them)
    alert = a1[0]
    assert alert.source_event_id == record.event_id and alert.request_id == "r1"
    assert alert.baseline.startswith("static:") and alert.threshold == 1.5
    assert abs(alert.value - 0.4) < 1e-2


def test_request_that_never_completes_becomes_a_dead_letter_after_the_ttl():
    detector = EntropyAnomalyDetector(incomplete_ttl_s=60)
    chunk = tokens([NORMAL] * 4 + [0.3] * 3, request_id="stuck", chunk_index=0, final=False)
    done = tokens([NORMAL] * 4, request_id="fine", chunk_index=0, final=False)
    detector.process_batch([chunk, done])
    detector.process(tokens([NORMAL] * 4, request_id="fine", chunk_index=1, first_token_index=4))
    assert detector.on_watermark(chunk.emitted_at + 59) == []  # within the TTL: still waiting
    letters = detector.on_watermark(chunk.emitted_at + 61)
    assert [d.request_id for d in letters] == ["stuck"]
    letter = letters[0]
    assert isinstance(letter, DeadLetter) and letter.error_type == "incomplete_request"
    assert "never completed" in letter.reason and letter.source_topic == TokenEntropy.topic
    assert decode(letter.payload) == chunk
    assert detector.on_watermark(chunk.emitted_at + 1000) == []  # reported once, state dropped


# --- the carry state: durable under Faust (a changelogged table), so a new instance continues ----


def boundary_loop(tail: int) -> tuple[TokenEntropy, TokenEntropy]:
    """Chunk 0 ends in a 3-token loop that chunk 1 continues for ``tail`` tokens: one loop, 8..11+tail."""
    first = tokens([NORMAL] * 8 + [0.3] * 3, request_id="long", chunk_index=0, final=False)
    second = tokens([0.3] * tail + [NORMAL] * 4, request_id="long", chunk_index=1, first_token_index=11, final=True)
    return first, second


def assert_finished_then_dropped(detector: EntropyAnomalyDetector, final: TokenEntropy) -> None:
    """After the final chunk the request keeps only a small finished marker (no chunk bytes, for a
    redelivery of that chunk); the TTL drops it without a dead letter."""
    carry = detector.state[final.request_id]
    assert carry.finished and carry.last_chunk == b"" and carry.open_runs == {}
    assert detector.on_watermark(final.emitted_at + detector.incomplete_ttl_s + 1) == []
    assert final.request_id not in detector.state


@pytest.mark.parametrize("tail", [4, 6])  # 4: the tail alone is under min_run; 6: it is not
def test_a_new_instance_given_the_state_continues_a_loop_across_the_chunk_boundary(tail):
    first, second = boundary_loop(tail)
    one_instance = EntropyAnomalyDetector()
    one_instance.process(first)
    expected = one_instance.process(second)
    assert spans(expected) == [("repetition_loop", 8, 11 + tail)]

    state: dict = {}
    assert EntropyAnomalyDetector(state=state).process(first) == []
    recovered = EntropyAnomalyDetector(state=state)  # the worker restarted, or the partition moved
    assert recovered.process(second) == expected  # same event id, span and alert key
    assert_finished_then_dropped(recovered, second)

    # Without the state the next instance sees only the tail: no alert, or one with the wrong start.
    forgetful = EntropyAnomalyDetector().process(second)
    assert forgetful != expected
    assert spans(forgetful) == ([] if tail < 5 else [("repetition_loop", 11, 11 + tail)])


def test_a_new_instance_given_the_state_reports_the_incomplete_request_after_the_ttl():
    chunk = tokens([NORMAL] * 4 + [0.3] * 3, request_id="stuck", chunk_index=0, final=False)
    one_instance = EntropyAnomalyDetector(incomplete_ttl_s=60)
    one_instance.process(chunk)
    expected = one_instance.on_watermark(chunk.emitted_at + 61)
    assert [d.error_type for d in expected] == ["incomplete_request"]

    state: dict = {}
    EntropyAnomalyDetector(incomplete_ttl_s=60, state=state).process(chunk)
    recovered = EntropyAnomalyDetector(incomplete_ttl_s=60, state=state)
    assert recovered.on_watermark(chunk.emitted_at + 59) == []
    assert recovered.on_watermark(chunk.emitted_at + 61) == expected  # same id, reason and payload
    assert state == {}
    assert EntropyAnomalyDetector(incomplete_ttl_s=60).on_watermark(chunk.emitted_at + 61) == []  # forgotten


def test_a_single_chunk_request_never_writes_the_state():
    class RecordingState(dict):
        def __init__(self):
            super().__init__()
            self.writes: list[str] = []

        def __setitem__(self, key, value):
            self.writes.append(key)
            super().__setitem__(key, value)

        def __delitem__(self, key):
            self.writes.append(key)
            super().__delitem__(key)

        def pop(self, key, *default):
            if key in self:
                self.writes.append(key)
            return super().pop(key, *default)

    state = RecordingState()
    detector = EntropyAnomalyDetector(state=state)
    detector.process_batch([tokens([NORMAL] * 5 + [0.3] * 6, request_id=f"s{i}") for i in range(20)])
    assert state.writes == [] and state == {}
    first, second = boundary_loop(4)
    detector.process(first)
    detector.process(second)
    assert state.writes == ["long", "long"]  # chunk 0 wrote its carry, the final chunk its finished marker
    assert_finished_then_dropped(detector, second)
    assert state.writes == ["long", "long", "long"] and state == {}


def test_the_carry_round_trips_the_table_codec():
    first, _ = boundary_loop(4)
    state: dict = {}
    EntropyAnomalyDetector(state=state).process(first)
    carry = state["long"]
    assert isinstance(carry, EntropyCarry) and carry.next_chunk == 1 and carry.open_runs["repetition_loop"].start == 8
    spec = EntropyAnomalyDetector.table_state
    assert spec.name == "entropy_carry"
    raw = spec.encode(carry)
    assert isinstance(raw, bytes) and spec.decode(raw) == carry
    assert decode(spec.decode(raw).last_chunk) == first


def test_the_carry_survives_through_a_recovered_table():
    """The Faust path: writes go through TableState to the changelog, and a new table recovered
    from that changelog alone gives the new instance the carry (chunk 1 on another worker)."""
    first, second = boundary_loop(4)
    one_instance = EntropyAnomalyDetector()
    one_instance.process(first)
    expected = one_instance.process(second)

    table = FakeTable()
    state = TableState(table, EntropyAnomalyDetector.table_state)
    state.partition = 2
    EntropyAnomalyDetector(state=state).process(first)
    state.flush()
    restarted = FakeTable()
    restarted.recover(table.changelog)
    state2 = TableState(restarted, EntropyAnomalyDetector.table_state)
    state2.partition = 2
    recovered = EntropyAnomalyDetector(state=state2)
    assert recovered.process(second) == expected
    state2.flush()
    [(partition, key, marker)] = restarted.changelog
    assert (partition, key) == (2, b"long") and marker is not None and decode_carry(marker).finished
    state2.partition = None  # expiry runs outside a partition group: the key's partition is known
    assert_finished_then_dropped(recovered, second)
    state2.flush()
    assert restarted.changelog[-1] == (2, b"long", None) and dict(state2) == {}  # a tombstone: recovery drops it


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.lists(st.sampled_from([0.3, 1.4, 3.0, 4.6, 6.0]), min_size=1, max_size=12), min_size=1, max_size=5),
    st.integers(min_value=0, max_value=4),
)
def test_chunks_split_across_instances_find_the_runs_of_the_whole_generation(chunks, replay_from):
    """Each chunk on a NEW instance sharing only ``state``: the runs are those of the unchunked
    sequence. Then the chunks from ``replay_from`` on are delivered again (a worker that died before
    committing them): each yields exactly what it yielded the first time.

    (Chunks are non-empty, as the collector ships them: an empty non-final chunk closes a carried run.)"""
    state: dict = {}
    records, first = [], 0
    for i, values in enumerate(chunks):
        records.append(tokens(values, request_id="g", chunk_index=i, first_token_index=first,
                              final=i == len(chunks) - 1))
        first += len(values)
    per_chunk = [EntropyAnomalyDetector(state=state).process(record) for record in records]
    whole = spans(EntropyAnomalyDetector().process(tokens([v for c in chunks for v in c], request_id="g")))
    assert sorted(spans([a for alerts in per_chunk for a in alerts])) == sorted(whole)
    after_first_pass = dict(state)
    for record, alerts in list(zip(records, per_chunk))[replay_from:]:
        assert EntropyAnomalyDetector(state=state).process(record) == alerts
    assert state == after_first_pass  # redelivery changes nothing
    assert [carry.finished for carry in state.values()] == ([True] if len(chunks) > 1 else [])


# --- at-least-once: a redelivered chunk yields the alerts it yielded the first time -------------


@pytest.mark.parametrize("tail", [4, 6])
def test_a_redelivered_final_chunk_yields_the_same_alert(tail):
    """A worker that dies after processing the final chunk but before committing its offset, or
    Faust delivering prefetched records again after table recovery, hands the chunk over twice."""
    first, second = boundary_loop(tail)
    state: dict = {}
    EntropyAnomalyDetector(state=state).process(first)
    expected = EntropyAnomalyDetector(state=state).process(second)
    assert spans(expected) == [("repetition_loop", 8, 11 + tail)]
    assert EntropyAnomalyDetector(state=state).process(second) == expected  # not (11, 11 + tail)


def test_a_redelivered_non_final_chunk_yields_the_same_alerts_and_carry():
    first, _ = boundary_loop(4)  # chunk 0 ends in a loop at 8..11
    # chunk 1 closes that loop at 14 and opens another at 16 that chunk 2 closes at 22
    middle = tokens([0.3] * 3 + [NORMAL] * 2 + [0.3] * 2, request_id="long", chunk_index=1, first_token_index=11,
                    final=False)
    last = tokens([0.3] * 4, request_id="long", chunk_index=2, first_token_index=18, final=True)
    once = EntropyAnomalyDetector()
    expected = once.process(first) + once.process(middle) + once.process(last)
    assert spans(expected) == [("repetition_loop", 8, 14), ("repetition_loop", 16, 22)]

    twice = EntropyAnomalyDetector()
    twice.process(first)
    assert twice.process(middle) == expected[:1]
    assert twice.process(middle) == expected[:1]  # redelivered: the same run 8..14 and the same carry
    assert twice.process(last) == expected[1:]
