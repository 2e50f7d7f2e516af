"""TokenEntropy's optional per-token arrays (surprisals, sampling_entropies): one float16 per token,
refused when malformed naming the field, and records written before they existed decode."""

from __future__ import annotations

import time

import msgspec
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entroloop.contract.codec import decode, encode
from entroloop.contract.ids import derived_event_id
from entroloop.contract.records import TokenEntropy, pack_entropies

NOW = time.time()  # the codec refuses records outside its event-time window
COMMON = {"event_id": derived_event_id("r", "n", 1, at=NOW), "emitted_at": NOW, "node_id": "n", "seq": 1, "request_id": "r",
          "trace_id": "0" * 31 + "1", "model": "m"}
FIELDS = pytest.mark.parametrize(("field", "reader"), [
    ("surprisals", "surprisal_values"),
    ("sampling_entropies", "sampling_values"),
])


@FIELDS
def test_the_array_round_trips(field: str, reader: str) -> None:
    record = TokenEntropy(**COMMON, entropies=pack_entropies([0.1, 3.0]), **{field: pack_entropies([0.05, 9.5])})
    again = decode(encode(record))
    assert isinstance(again, TokenEntropy)
    assert np.allclose(getattr(again, reader)(), [0.05, 9.5], atol=0.01)


@FIELDS
@pytest.mark.parametrize(("values", "message"), [
    ([1.0], "one packed float16 per token"),
    ([1.0, float("nan")], "NaN, Inf or a negative"),
    ([1.0, -2.0], "NaN, Inf or a negative"),
    ([float("inf"), 1.0], "NaN, Inf or a negative"),
])
def test_a_malformed_array_is_refused_naming_the_field(field: str, reader: str, values: list[float], message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        TokenEntropy(**COMMON, entropies=pack_entropies([0.1, 0.2]), **{field: pack_entropies(values)})
    assert field in str(caught.value)


@FIELDS
def test_a_record_written_before_the_field_existed_decodes_without_it(field: str, reader: str) -> None:
    record = TokenEntropy(**COMMON, entropies=pack_entropies([1.0]))
    raw = msgspec.msgpack.decode(encode(record))
    del raw[field]
    old = decode(msgspec.msgpack.encode(raw))
    assert isinstance(old, TokenEntropy) and getattr(old, field) == b"" and getattr(old, reader)() is None


@FIELDS
@settings(max_examples=300, deadline=None, derandomize=True)
@given(bits=st.lists(st.integers(min_value=0, max_value=0xFFFF), min_size=2, max_size=2))
def test_refused_exactly_when_a_value_is_nan_inf_or_negative(field: str, reader: str, bits: list[int]) -> None:
    """The check looks at the high bytes first (one C pass) and at the values only when one could be
    bad: the verdict is the plain one on every bit pattern (-0.0 is a harmless zero)."""
    packed = np.array(bits, dtype="<u2").tobytes()
    bad = any(b >= 0x7C00 and b != 0x8000 for b in bits)
    try:
        TokenEntropy(**COMMON, entropies=pack_entropies([0.1, 0.2]), **{field: packed})
    except ValueError as exc:
        assert bad and field in str(exc)
    else:
        assert not bad
