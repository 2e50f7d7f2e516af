"""The file of records the broker refused for good: durable, private, read back byte for byte."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from entroloop.collectors.rejected import RejectedRecords, read_rejected


def test_refused_records_are_kept_privately_and_read_back_exactly(tmp_path: Path) -> None:
    kept = RejectedRecords(tmp_path / "spool" / "rejected" / "node.spool.jsonl")
    assert not kept.path.exists()  # created by the first refusal, not before
    values = [b"\x00\xffbinary", "请求 ok".encode()]
    shas = [kept.keep("p.entroloop.audit.v1", b"req-1", value, "MSG_SIZE_TOO_LARGE", "too large") for value in values]
    assert shas == [hashlib.sha256(v).hexdigest() for v in values]
    assert kept.path.stat().st_mode & 0o777 == 0o600
    assert kept.path.parent.stat().st_mode & 0o777 == 0o700
    entries = read_rejected(kept.path)
    assert [e["value"] for e in entries] == values
    assert entries[0]["topic"] == "p.entroloop.audit.v1" and entries[0]["key"] == "req-1"
    assert entries[0]["error"] == "MSG_SIZE_TOO_LARGE" and entries[1]["size"] == len(values[1])


def test_a_damaged_line_is_named(tmp_path: Path) -> None:
    kept = RejectedRecords(tmp_path / "r.jsonl")
    kept.keep("t", b"k", b"v", "E", "r")
    with kept.path.open("a") as fh:
        fh.write('{"topic": "t", "value_b64": "not base64!"}\n')
    with pytest.raises(ValueError, match=r"r\.jsonl:2: not a rejected-record line"):
        read_rejected(kept.path)
