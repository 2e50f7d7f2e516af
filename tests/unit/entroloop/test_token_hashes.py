"""TokenEntropy.token_hashes: optional, one uint32 per token, old records still decode."""

from __future__ import annotations

import time

import msgspec
import numpy as np
import pytest

from entroloop.contract.codec import decode, encode
from entroloop.contract.ids import derived_event_id
from entroloop.contract.records import TokenEntropy, pack_entropies, pack_token_hashes

NOW = time.time()  # the codec refuses records outside its event-time window
COMMON = {"event_id": derived_event_id("r", "n", 1, at=NOW), "emitted_at": NOW, "node_id": "n", "seq": 1, "request_id": "r",
          "trace_id": "0" * 31 + "1", "model": "m"}


def test_hashes_round_trip_and_wrap_large_ids() -> None:
    record = TokenEntropy(**COMMON, entropies=pack_entropies([0.1, 0.2, 0.3]),
                          token_hashes=pack_token_hashes([5, 2**32 + 7, 2**40]))
    again = decode(encode(record))
    assert isinstance(again, TokenEntropy)
    assert again.hashes().tolist() == [5, 7, 0]  # type: ignore[union-attr]


def test_hashes_must_match_the_token_count() -> None:
    with pytest.raises(ValueError, match="one packed uint32 per token"):
        TokenEntropy(**COMMON, entropies=pack_entropies([0.1, 0.2]), token_hashes=pack_token_hashes([1]))


def test_a_record_written_before_the_field_existed_decodes_with_no_hashes() -> None:
    record = TokenEntropy(**COMMON, entropies=pack_entropies([1.0]))
    raw = msgspec.msgpack.decode(encode(record))
    del raw["token_hashes"]
    old = decode(msgspec.msgpack.encode(raw))
    assert isinstance(old, TokenEntropy) and old.token_hashes == b"" and old.hashes() is None
    assert np.isclose(old.values()[0], 1.0)
