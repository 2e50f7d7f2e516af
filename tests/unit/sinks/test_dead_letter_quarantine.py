"""Dead letters keep the reason, the size and a SHA-256; the raw bytes go to a quarantine read by id.

Issue 12, finding 2: `dead_letters.payload` kept the first 4 KB of whatever could not be stored,
often an audit with a prompt and an answer in clear, and any analyst could search it. The table
now holds no payload, and the quarantine (write-once, 0400) gives the bytes back by dead-letter id
only.
"""

from __future__ import annotations

import hashlib

import pytest
from entroloop.sinks.clickhouse.writer import ClickHouseSink

from entroloop.contract.codec import MalformedRecord, dead_letter_at, dead_letter_fields
from entroloop.contract.ids import derived_event_id
from entroloop.contract.records import DeadLetter
from entroloop.infra.quarantine import NotQuarantined, local_quarantine

PII_PAYLOAD = "我的手机号13900001111，邮箱是bob.jones@example.org，订单 A-778 的回答".encode() * 200  # > 4 KB


def letter(offset: int, payload: bytes = PII_PAYLOAD) -> DeadLetter:
    err = MalformedRecord("not a record: truncated MessagePack")
    return dead_letter_at("entroloop.audit.v1", 0, offset, key=b"req-1", payload=payload, error=err, node_id="runner")


def test_a_dead_letter_is_named_by_its_position_alone():
    """Every stage builds dead letters with dead_letter_at: a redelivered poison record, or one that
    the worker and a sink both refuse, is one row, whoever wrote it and whenever."""
    first = letter(7)
    again = dead_letter_at("entroloop.audit.v1", 0, 7, key="req-1", payload=b"other", error=MalformedRecord("y"),
                           node_id="sink-audit", emitted_at=first.emitted_at + 60)
    assert first.event_id == again.event_id == derived_event_id("entroloop.audit.v1/0/7", "dead_letter", at=0.0)
    assert first.request_id == again.request_id == "req-1"  # bytes keys decoded, str keys kept
    assert letter(8).event_id != first.event_id
    assert dead_letter_at("entroloop.audit.v1", 1, 7, key=None, payload=b"", error=MalformedRecord("y"),
                          node_id="runner").event_id != first.event_id
    assert (first.source_topic, first.source_partition, first.source_offset, first.seq) == ("entroloop.audit.v1", 0, 7, 7)


def test_dead_letter_fields_hash_the_whole_payload_not_just_the_kept_start():
    fields = dead_letter_fields(MalformedRecord("x"), PII_PAYLOAD)
    assert fields["payload_sha256"] == hashlib.sha256(PII_PAYLOAD).hexdigest()
    assert fields["payload_size"] == len(PII_PAYLOAD) > len(fields["payload"])


@pytest.fixture
def sink_and_quarantine(chdb_client, ch_database, tmp_path):
    quarantine = local_quarantine(tmp_path)
    return ClickHouseSink(chdb_client, ch_database, quarantine=quarantine), quarantine


def test_the_table_holds_no_payload_and_the_quarantine_holds_it(sink_and_quarantine, chdb_client, ch_database):
    sink, quarantine = sink_and_quarantine
    dead = letter(7)
    sink.write(DeadLetter.topic, 0, 7, 7, [dead])
    rows = chdb_client.query(
        f"SELECT event_id, payload, payload_sha256, payload_size, reason FROM {ch_database}.dead_letters"
    ).result_rows
    (event_id, payload, sha, size, reason) = rows[0]
    assert payload in ("", b"")
    assert "13900001111" not in str(rows) and "example.org" not in str(rows)
    assert sha == hashlib.sha256(PII_PAYLOAD).hexdigest() and size == len(PII_PAYLOAD) and reason
    kept = quarantine.get(str(event_id))
    assert kept.data == dead.payload  # what travelled with the letter (its first 4 KB here)
    assert kept.data == PII_PAYLOAD[: len(kept.data)]


def test_whole_payload_kept_first_is_never_replaced_by_the_carried_start(sink_and_quarantine):
    """The embedded runner quarantines the whole payload when it makes the letter; the sink later
    sees only the carried start under the same id and must not fail or replace it."""
    sink, quarantine = sink_and_quarantine
    dead = quarantine.keep(letter(8), PII_PAYLOAD)
    assert dead.payload == b"" and dead.payload_sha256 == hashlib.sha256(PII_PAYLOAD).hexdigest()
    sink.write(DeadLetter.topic, 0, 8, 8, [letter(8)])  # a redelivery carrying the 4 KB start
    assert quarantine.get(dead.event_id).data == PII_PAYLOAD


def test_a_sink_without_quarantine_still_stores_no_payload(chdb_client, ch_database):
    sink = ClickHouseSink(chdb_client, ch_database)
    sink.write(DeadLetter.topic, 0, 9, 9, [letter(9)])
    (payload,) = chdb_client.query(f"SELECT payload FROM {ch_database}.dead_letters").result_rows[0]
    assert payload in ("", b"")


def test_reading_needs_an_id(tmp_path):
    quarantine = local_quarantine(tmp_path)
    quarantine.put(letter(1).event_id, b"secret")
    for not_an_id in ("*", "../worm/audit", "", "quarantine/", "0" * 36):
        with pytest.raises(ValueError, match="not a dead-letter id"):
            quarantine.get(not_an_id)
    with pytest.raises(NotQuarantined):
        quarantine.get(letter(2).event_id)
    assert quarantine.get(letter(1).event_id.upper()).data == b"secret"
