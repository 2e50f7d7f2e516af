"""The codec: every record type round-trips; bad bytes give typed errors, never other exceptions."""

from __future__ import annotations

import math

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entroloop.contract.codec import (
    CodecError,
    MalformedRecord,
    RecordTooLarge,
    UnsupportedSchemaVersion,
    decode,
    decode_many,
    encode,
    gc_paused,
)
from entroloop.contract.ids import NodeStamper
from entroloop.contract.records import (
    RECORD_TYPES,
    Action,
    Alert,
    Audit,
    BadCase,
    DeadLetter,
    Fallback,
    Feedback,
    Health,
    IntentScore,
    RetrainRequest,
    Span,
    TokenEntropy,
    pack_entropies,
)

stamper = NodeStamper("node-test")
text = st.text(max_size=200)
finite = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)
nats = st.lists(st.floats(min_value=0.0, max_value=12.0, width=16), max_size=300)


def common(request_id: str) -> dict:
    return {**stamper.stamp(), "request_id": request_id, "trace_id": "0af7651916cd43dd8448eb211c80319c"}


record_strategies = [
    st.builds(lambda rid, m, v: TokenEntropy(**common(rid), model=m, entropies=pack_entropies(v)), text, text, nats),
    st.builds(lambda rid, n, s, e: Span(**common(rid), span_id="b7ad6b7169203331", name=n, start_time=1.7e9 + s,
                                        end_time=1.7e9 + s + e, ttft_s=e, attributes={"k": n, "n": 3}),
              text, text, finite, finite),
    st.builds(lambda rid, p, r: Audit(**common(rid), audit_id="a", model="m", prompt=p, response=r,
                                      sampling={"temperature": 0.7}, redactions={"email": 1}), text, text, text),
    st.builds(lambda rid, c: Feedback(**common(rid), rating=-1, corrected_answer=c), text, text),
    st.builds(lambda rid, r: Fallback(**common(rid), model="m", reason=r), text, text),
    st.builds(lambda rid, s: IntentScore(**common(rid), model="m", similarity=s), text, finite),
    st.builds(lambda rid, p, c, labels: BadCase(**common(rid), model="m", prompt=p, response=p, correction=c,
                                                labels=labels, diff=[("replace", p, c)], minimal_span=(0, 3)),
              text, text, text, st.lists(text, max_size=4)),
    st.builds(lambda rid, v: Alert(**common(rid), alert_key="k", rule="repetition_loop", value=v), text, finite),
    st.builds(lambda rid: Action(**common(rid), action_id="x", action="pause_route", dry_run=True), text),
    st.builds(lambda rid: RetrainRequest(**common(rid), trigger_key="t", model="m", category="format", reason="r"), text),
    st.builds(lambda rid, v: Health(**common(rid), component="sink", metric="lag", value=v), text, finite),
    st.builds(lambda rid, b: DeadLetter(**common(rid), source_topic="t", source_partition=0, source_offset=1,
                                        reason="r", error_type="malformed", payload=b), text, st.binary(max_size=100)),
]


@settings(max_examples=60, deadline=None)
@given(st.one_of(record_strategies))
def test_every_record_round_trips(record):
    assert decode(encode(record)) == record


@settings(max_examples=3, deadline=None)
@given(st.data())
def test_strategies_cover_every_record_type(data):
    covered = {type(data.draw(s)) for s in record_strategies}
    assert covered == set(RECORD_TYPES)


def test_entropies_travel_as_two_bytes_per_token():
    values = np.array([0.0, 1.25, 3.5, 7.75])
    record = TokenEntropy(**common("r"), model="m", entropies=pack_entropies(values))
    assert len(record.entropies) == 2 * len(values)
    np.testing.assert_allclose(decode(encode(record)).values(), values, atol=1e-3)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_garbage_bytes_raise_only_codec_errors(data):
    try:
        decode(data)
    except CodecError as err:
        assert err.reason and err.error_type
    # some short byte strings are valid msgpack but never a full record; any success must be a record
    else:  # pragma: no cover - would mean random bytes made a whole record
        pytest.fail("random bytes decoded into a record")


def test_truncated_record_is_malformed():
    data = encode(Feedback(**common("r"), rating=1))
    with pytest.raises(MalformedRecord):
        decode(data[:-5])


@pytest.mark.parametrize("version", [0, 2, 99])
def test_old_or_unknown_schema_versions_are_rejected_with_the_version_named(version):
    raw = msgspec.msgpack.decode(encode(Fallback(**common("r"), model="m", reason="timeout")))
    raw["schema_version"] = version
    with pytest.raises(UnsupportedSchemaVersion, match=f"schema_version {version}"):
        decode(msgspec.msgpack.encode(raw))


def test_unknown_kind_is_malformed():
    raw = msgspec.msgpack.decode(encode(Fallback(**common("r"), model="m", reason="timeout")))
    raw["kind"] = "telepathy"
    with pytest.raises(MalformedRecord):
        decode(msgspec.msgpack.encode(raw))


@pytest.mark.parametrize("bad", [[1.0, math.nan], [math.inf], [-1.0]])
def test_invalid_entropy_values_are_rejected(bad):
    raw = msgspec.msgpack.decode(encode(TokenEntropy(**common("r"), model="m", entropies=pack_entropies([1.0]))))
    raw["entropies"] = pack_entropies(bad)
    with pytest.raises(MalformedRecord):
        decode(msgspec.msgpack.encode(raw))


def test_invalid_utf8_is_malformed():
    data = encode(Feedback(**common("r"), rating=1, comment="é"))
    corrupted = data.replace("é".encode(), b"\xff\xfe")
    with pytest.raises(MalformedRecord):
        decode(corrupted)


def test_oversized_record_is_rejected_before_parsing():
    data = encode(Audit(**common("r"), audit_id="a", model="m", prompt="x" * 5000, response=""))
    with pytest.raises(RecordTooLarge):
        decode(data, max_bytes=4096)


def test_negative_zero_entropy_is_a_valid_zero():
    record = TokenEntropy(**common("r"), model="m", entropies=pack_entropies([-0.0, 2.0]))
    assert decode(encode(record)).values().tolist() == [0.0, 2.0]


def _outcome(data: bytes, max_bytes: int) -> object:
    """What ``decode`` makes of ``data``: the record, or (error type, class, reason)."""
    try:
        return decode(data, max_bytes)
    except CodecError as err:
        return (type(err), err.error_type, err.reason)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.one_of(st.one_of(record_strategies).map(encode), st.binary(max_size=120)), max_size=30))
def test_decode_many_gives_each_payload_what_decode_gives_it(payloads):
    """Valid records and poison in one batch: each item is decode's record or decode's error, in order."""
    limit = 400  # some generated records exceed it: too_large must be per item too
    got = decode_many(payloads, limit)
    assert len(got) == len(payloads)
    for data, item in zip(payloads, got):
        expected = _outcome(data, limit)
        if isinstance(item, CodecError):
            assert (type(item), item.error_type, item.reason) == expected
        else:
            assert item == expected


def test_decode_many_keeps_a_poison_record_with_its_reason_between_good_ones():
    good = [encode(Span(**common(f"r{i}"), span_id="s", name="llm_request", start_time=1.0, end_time=2.0)) for i in range(3)]
    raw = msgspec.msgpack.decode(encode(TokenEntropy(**common("r-nan"), model="m", entropies=pack_entropies([1.0]))))
    raw["entropies"] = pack_entropies([math.nan])
    nan = msgspec.msgpack.encode(raw)
    got = decode_many([good[0], nan, good[1], b"\xc1", good[2]])
    assert [type(x).__name__ for x in got] == ["Span", "MalformedRecord", "Span", "MalformedRecord", "Span"]
    assert "NaN" in got[1].reason
    assert [x.request_id for x in got if isinstance(x, Span)] == ["r0", "r1", "r2"]


@pytest.mark.parametrize("enabled", [True, False])
def test_gc_paused_restores_the_collector_state(enabled):
    import gc

    was = gc.isenabled()
    try:
        gc.enable() if enabled else gc.disable()
        with gc_paused():
            assert not gc.isenabled()
        assert gc.isenabled() is enabled
        with pytest.raises(RuntimeError), gc_paused():
            raise RuntimeError("boom")
        assert gc.isenabled() is enabled
    finally:
        gc.enable() if was else gc.disable()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=0xFFFF), max_size=40))
def test_entropy_check_accepts_exactly_the_finite_non_negative_halves(halves):
    """Any bit pattern: decoded iff every float16 is finite and >= 0 (-0.0 counts as 0), else a named reason."""
    raw = msgspec.msgpack.decode(encode(TokenEntropy(**common("r"), model="m")))
    raw["entropies"] = np.asarray(halves, dtype="<u2").tobytes()
    values = np.asarray(halves, dtype="<u2").view("<f2")
    valid = all(np.isfinite(v) and (v >= 0) for v in values)
    if valid:
        assert decode(msgspec.msgpack.encode(raw)).entropies == raw["entropies"]
    else:
        with pytest.raises(MalformedRecord, match="NaN or Inf|>= 0 nats"):
            decode(msgspec.msgpack.encode(raw))
