"""Decode validates every field: a record that is valid MessagePack but wrong is a ``CodecError`` with
a reason (so a dead letter), never a record that fails a sink later (issue 12, finding 4)."""

from __future__ import annotations

import time

import msgspec
import pytest

from entroloop.contract.codec import (
    CodecError,
    EventTimeWindow,
    MalformedRecord,
    OutOfTimeWindow,
    decode,
    decode_many,
    encode,
)
from entroloop.contract.ids import NodeStamper
from entroloop.contract.records import (
    RATING_MAX,
    RATING_MIN,
    Alert,
    Audit,
    DeadLetter,
    Feedback,
    Span,
    TokenEntropy,
    pack_entropies,
)
from entroloop.contract.settings import Settings, SettingsError, load_settings

stamper = NodeStamper("node-validate")
DAY = 86_400.0


def _now_common(request_id: str = "req-1") -> dict:
    return {**stamper.stamp(), "request_id": request_id}


def _audit(**changes: object) -> bytes:
    """An encoded audit record with ``changes`` applied to its wire fields (as a hostile producer would)."""
    return _wire(Audit(**_now_common(), audit_id="a-1", model="m", prompt="p", response="r"), **changes)


def _wire(record: object, **changes: object) -> bytes:
    fields = msgspec.msgpack.decode(encode(record))  # the wire map, "kind" included
    fields.update(changes)
    return msgspec.msgpack.encode(fields)


def _span() -> Span:
    at = time.time()
    return Span(**_now_common(), span_id="s1", name="llm_request", start_time=at - 1, end_time=at,
                prompt_tokens=12, output_tokens=40)


def _feedback() -> Feedback:
    return Feedback(**_now_common(), rating=-1, error_type="numbers")


# --- the reproductions: each is a reasoned CodecError, never a record ---------------------------
POISON = {
    "event id that is no UUID": (lambda: _audit(event_id="not-a-uuid"), "$.event_id"),
    "seq=-1": (lambda: _audit(seq=-1), "$.seq"),
    "prompt_tokens=-5": (lambda: _wire(_span(), prompt_tokens=-5), "$.prompt_tokens"),
    "rating=1000": (lambda: _wire(_feedback(), rating=1000), "$.rating"),
    "emitted_at NaN": (lambda: _audit(emitted_at=float("nan")), "$.emitted_at"),
    "emitted_at Inf": (lambda: _audit(emitted_at=float("inf")), "$.emitted_at"),
    "emitted_at 0 (1970)": (lambda: _audit(emitted_at=0.0), "$.emitted_at"),
    "emitted_at 1e12 (milliseconds as seconds)": (lambda: _audit(emitted_at=1e12), "$.emitted_at"),
    "emitted_at 100 days old": (lambda: _audit(emitted_at=time.time() - 100 * DAY), "ENTROLOOP_EVENT_MAX_AGE_DAYS"),
    "emitted_at 2 days in the future": (lambda: _audit(emitted_at=time.time() + 2 * DAY), "ENTROLOOP_EVENT_MAX_FUTURE_S"),
    "chunk_index=-1": (lambda: _wire(TokenEntropy(**_now_common(), model="m", entropies=pack_entropies([1.0])),
                                     chunk_index=-1), "$.chunk_index"),
    "negative redaction count": (lambda: _audit(redactions={"email": -3}), "$.redactions"),
    "source_offset=-1": (lambda: _wire(DeadLetter(**_now_common(), source_topic="t", source_partition=0,
                                                  source_offset=1, reason="r", error_type="malformed"),
                                       source_offset=-1), "$.source_offset"),
}


@pytest.mark.parametrize("name", list(POISON))
def test_a_decodable_but_wrong_record_is_a_codec_error_with_its_reason(name):
    payload, phrase = POISON[name][0](), POISON[name][1]
    with pytest.raises(CodecError) as caught:
        decode(payload)
    assert phrase in caught.value.reason, caught.value.reason
    assert caught.value.error_type in ("malformed", "out_of_time_window")


def test_the_time_window_errors_say_which_setting_to_change():
    with pytest.raises(OutOfTimeWindow) as old:
        decode(_audit(emitted_at=time.time() - 100 * DAY))
    assert old.value.error_type == "out_of_time_window"
    assert "100.0 days old" in old.value.reason and "older than 90 days" in old.value.reason


def test_decode_many_turns_each_poison_into_its_own_error_between_good_records():
    good = [encode(Audit(**_now_common(f"r{i}"), audit_id=f"a{i}", model="m", prompt="p", response="r"))
            for i in range(3)]
    got = decode_many([good[0], _audit(seq=-1), good[1], _wire(_feedback(), rating=1000), good[2]])
    assert [type(x).__name__ for x in got] == ["Audit", "MalformedRecord", "Audit", "MalformedRecord", "Audit"]


def test_valid_records_at_the_edges_of_every_range_decode():
    for rating in (RATING_MIN, -1, 0, 1, 5, RATING_MAX):
        record = msgspec.structs.replace(_feedback(), rating=rating)
        assert decode(encode(record)) == record
    span = msgspec.structs.replace(_span(), prompt_tokens=0, output_tokens=None, seq=0)
    assert decode(encode(span)) == span
    alert = Alert(**_now_common(), alert_key="k", rule="r")  # token_start/end default -1: "no token"
    assert decode(encode(alert)) == alert
    now = time.time()
    window = EventTimeWindow(max_age_s=90 * DAY, max_future_s=DAY)
    for at in (now - 89 * DAY, now, now + DAY - 60):
        record = msgspec.structs.replace(_feedback(), emitted_at=at)
        assert decode(encode(record), window=window, now=now) == record


@pytest.mark.parametrize("rating", [RATING_MIN - 1, RATING_MAX + 1, 127, -128, 1000])
def test_ratings_outside_the_documented_scale_are_refused(rating):
    with pytest.raises(MalformedRecord, match="rating"):
        decode(_wire(_feedback(), rating=rating))


def test_the_window_comes_from_the_settings_and_none_turns_it_off(monkeypatch):
    settings = Settings(event_max_age_days=200, event_max_future_s=0)
    window = EventTimeWindow.from_settings(settings)
    now = time.time()
    old = _audit(emitted_at=now - 150 * DAY)
    assert decode(old, window=window, now=now).emitted_at == pytest.approx(now - 150 * DAY)
    with pytest.raises(OutOfTimeWindow):
        decode(old, now=now)  # the default window: 90 days
    assert decode(old, window=None).emitted_at == pytest.approx(now - 150 * DAY)
    with pytest.raises(OutOfTimeWindow, match="in the future"):
        decode(_audit(emitted_at=now + 5), window=window, now=now)
    monkeypatch.setenv("ENTROLOOP_EVENT_MAX_AGE_DAYS", "0")
    with pytest.raises(SettingsError, match="ENTROLOOP_EVENT_MAX_AGE_DAYS"):
        load_settings()


@pytest.mark.parametrize("event_id", [
    "g" * 36,  # the right length, not hex
    "0190a0b1-0000-7000-8000-00000000000Z",
    "0190a0b1 0000-7000-8000-000000000001",  # a space where a hyphen goes
    "0190a0b1-0000-7000-8000-0000000000é1"[:36],  # not ASCII
    "0190a0b100000-7000-8000-000000000001",  # hyphens in the wrong places
])
def test_event_ids_that_only_look_like_uuids_are_refused_alone_and_in_a_batch(event_id):
    with pytest.raises(MalformedRecord, match="event_id"):
        decode(_audit(event_id=event_id))
    good = [encode(Audit(**_now_common(f"r{i}"), audit_id=f"a{i}", model="m", prompt="p", response="r"))
            for i in range(4)]
    got = decode_many(good[:2] + [_audit(event_id=event_id)] + good[2:])
    assert [type(x).__name__ for x in got] == ["Audit", "Audit", "MalformedRecord", "Audit", "Audit"]
    assert "event_id" in got[2].reason


def test_decode_many_applies_the_time_window_to_each_record():
    now = time.time()
    payloads = [_audit(), _audit(emitted_at=now - 100 * DAY), _audit(), _audit(emitted_at=now + 3 * DAY)]
    got = decode_many(payloads)
    assert [type(x).__name__ for x in got] == ["Audit", "OutOfTimeWindow", "Audit", "OutOfTimeWindow"]
    assert [type(x).__name__ for x in decode_many(payloads, window=None)] == ["Audit"] * 4
