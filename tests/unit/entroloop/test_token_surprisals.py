"""TokenEntropy.surprisals: optional, one float16 per token, refused when malformed, old records decode."""

from __future__ import annotations

import time

import msgspec
import numpy as np
import pytest

from entroloop.contract.codec import decode, encode
from entroloop.contract.ids import derived_event_id
from entroloop.contract.records import TokenEntropy, pack_entropies

NOW = time.time()  # the codec refuses records outside its event-time window
COMMON = {"event_id": derived_event_id("r", "n", 1, at=NOW), "emitted_at": NOW, "node_id": "n", "seq": 1, "request_id": "r",
          "trace_id": "0" * 31 + "1", "model": "m"}


def test_surprisals_round_trip() -> None:
    record = TokenEntropy(**COMMON, entropies=pack_entropies([0.1, 3.0]), surprisals=pack_entropies([0.05, 9.5]))
    again = decode(encode(record))
    assert isinstance(again, TokenEntropy)
    assert np.allclose(again.surprisal_values(), [0.05, 9.5], atol=0.01)  # type: ignore[arg-type]


@pytest.mark.parametrize(("values", "message"), [
    ([1.0], "one packed float16 per token"),
    ([1.0, float("nan")], "NaN, Inf or a negative"),
    ([1.0, -2.0], "NaN, Inf or a negative"),
])
def test_malformed_surprisals_are_refused_naming_the_field(values: list[float], message: str) -> None:
    with pytest.raises(ValueError, match=message) as caught:
        TokenEntropy(**COMMON, entropies=pack_entropies([0.1, 0.2]), surprisals=pack_entropies(values))
    assert "surprisals" in str(caught.value)


def test_a_record_written_before_the_field_existed_decodes_with_no_surprisals() -> None:
    record = TokenEntropy(**COMMON, entropies=pack_entropies([1.0]))
    raw = msgspec.msgpack.decode(encode(record))
    del raw["surprisals"]
    old = decode(msgspec.msgpack.encode(raw))
    assert isinstance(old, TokenEntropy) and old.surprisals == b"" and old.surprisal_values() is None
