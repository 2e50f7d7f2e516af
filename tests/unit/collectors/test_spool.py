"""The publisher's spool: framing, torn tails, replay order and cursor, disk limit, ownership."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from entroloop.collectors.spool import (
    Spool,
    SpoolFull,
    SpoolLocked,
    decode_body,
    encode_frame,
    iter_frames,
    orphan_spools,
)
from hypothesis import given, settings
from hypothesis import strategies as st


@given(
    topic=st.text(min_size=1, max_size=60),
    key=st.binary(max_size=100),
    value=st.binary(max_size=2000),
)
@settings(max_examples=200, deadline=None)
def test_frame_round_trip(topic: str, key: bytes, value: bytes) -> None:
    frame = encode_frame(topic, key, value)
    length, _crc = struct.unpack(">II", frame[:8])
    assert length == len(frame) - 8
    assert decode_body(frame[8:]) == (topic, key, value)
    [message] = list(iter_frames(frame))
    assert (message.topic, message.key, message.value, message.end) == (topic, key, value, len(frame))


def test_iter_frames_stops_at_torn_or_corrupt_tail() -> None:
    a, b = encode_frame("t", b"k1", b"v1"), encode_frame("t", b"k2", b"v2")
    assert [m.value for m in iter_frames(a + b[:-1])] == [b"v1"]
    corrupt = bytearray(a + b)
    corrupt[-1] ^= 0xFF
    assert [m.value for m in iter_frames(bytes(corrupt))] == [b"v1"]


def test_replay_order_and_cursor_survive_reopen(tmp_path: Path) -> None:
    path = tmp_path / "node.spool"
    spool = Spool(path, max_bytes=1 << 20, fsync="always")
    for i in range(10):
        spool.append("topic", f"k{i}".encode(), f"v{i}".encode())
    first = spool.read_pending(4)
    assert [m.value for m in first] == [b"v0", b"v1", b"v2", b"v3"]
    spool.advance(first[-1].end)
    spool.close()

    reopened = Spool(path, max_bytes=1 << 20)
    rest = reopened.read_pending(100)
    assert [m.value for m in rest] == [f"v{i}".encode() for i in range(4, 10)]
    reopened.advance(rest[-1].end)
    assert not reopened.has_pending()
    assert path.stat().st_size == 0, "a fully replayed spool is emptied"
    reopened.append("topic", b"k", b"after")
    assert [m.value for m in reopened.read_pending(10)] == [b"after"]
    reopened.close()


def test_torn_tail_is_cut_on_open_and_appends_continue(tmp_path: Path) -> None:
    path = tmp_path / "node.spool"
    spool = Spool(path, max_bytes=1 << 20)
    spool.append("t", b"k", b"whole")
    spool.close()
    with open(path, "ab") as f:  # a crash in the middle of the next append
        f.write(encode_frame("t", b"k", b"torn")[:-3])
    reopened = Spool(path, max_bytes=1 << 20)
    reopened.append("t", b"k", b"next")
    assert [m.value for m in reopened.read_pending(10)] == [b"whole", b"next"]
    reopened.close()


def test_disk_limit_raises_and_writes_nothing(tmp_path: Path) -> None:
    frame_size = len(encode_frame("t", b"k", b"x" * 100))
    spool = Spool(tmp_path / "s.spool", max_bytes=3 * frame_size)
    for _ in range(3):
        spool.append("t", b"k", b"x" * 100)
    with pytest.raises(SpoolFull):
        spool.append("t", b"k", b"x" * 100)
    assert spool.size_bytes == 3 * frame_size
    spool.advance(spool.read_pending(10)[-1].end)
    spool.append("t", b"k", b"x" * 100)  # room again once replayed
    spool.close()


def test_bad_fsync_policy_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="fsync"):
        Spool(tmp_path / "s.spool", max_bytes=1000, fsync="sometimes")  # type: ignore[arg-type]


@pytest.mark.parametrize("policy", ["always", "batch", "never"])
def test_every_fsync_policy_keeps_frames_after_close(tmp_path: Path, policy: str) -> None:
    spool = Spool(tmp_path / "s.spool", max_bytes=1 << 20, fsync=policy)  # type: ignore[arg-type]
    for i in range(50):
        spool.append("t", b"k", str(i).encode())
    spool.sync()
    spool.close()
    data = (tmp_path / "s.spool").read_bytes()
    assert [m.value for m in iter_frames(data)] == [str(i).encode() for i in range(50)]


def test_a_live_owner_locks_others_out_and_orphans_are_listed(tmp_path: Path) -> None:
    owned = Spool(tmp_path / "a.spool", max_bytes=1000)
    with pytest.raises(SpoolLocked):
        Spool(tmp_path / "a.spool", max_bytes=1000)
    other = tmp_path / "b.spool"
    Spool(other, max_bytes=1000).close()
    assert orphan_spools(tmp_path, tmp_path / "b.spool") == [tmp_path / "a.spool"]
    owned.close()
    Spool(tmp_path / "a.spool", max_bytes=1000).close()  # the lock went with its owner


def test_read_pending_returns_a_frame_larger_than_the_read_window(tmp_path: Path) -> None:
    spool = Spool(tmp_path / "s.spool", max_bytes=1 << 22)
    spool.append("t", b"k", b"y" * 100_000)
    assert [len(m.value) for m in spool.read_pending(10, max_bytes=1000)] == [100_000]
    spool.close()
