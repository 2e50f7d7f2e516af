"""A batch ClickHouse refuses because of one record: the sink bisects it, stores the rest, hands the
record to ``on_poison`` with ClickHouse's error, and a redelivery of the batch stores nothing twice
(issue 12, finding 4). Real chDB; the poison records are built in Python, as a producer that skips
this build's decode-time validation would send them."""

from __future__ import annotations

import time

import msgspec
import pytest
from clickhouse_connect.driver.exceptions import DatabaseError, OperationalError
from entroloop.sinks.clickhouse.poison import (
    PoisonRecordsError,
    SystemicInsertError,
    insert_isolating_poison,
)
from entroloop.sinks.clickhouse.writer import ClickHouseSink

from entroloop.contract.ids import NodeStamper
from entroloop.contract.records import Audit, Feedback, Span

stamper = NodeStamper("node-poison")


def _audits(n: int) -> list[Audit]:
    return [Audit(**stamper.stamp(), request_id=f"req-{i}", audit_id=f"a-{i}", model="m", prompt="p", response="r")
            for i in range(n)]


def _span(**changes: object) -> Span:
    at = time.time()
    span = Span(**stamper.stamp(), request_id="req-s", span_id="s", name="llm_request", start_time=at - 1, end_time=at)
    return msgspec.structs.replace(span, **changes)


def _raw_count(client, database: str, table: str) -> int:
    """Rows as stored, without FINAL: a duplicate insert would show here."""
    return int(client.query(f"SELECT count() FROM {database}.{table}").result_rows[0][0])


@pytest.mark.parametrize(
    ("name", "poison_of"),
    [
        ("event id that is no UUID", lambda good: msgspec.structs.replace(good, event_id="not-a-uuid")),
        ("seq=-1", lambda good: msgspec.structs.replace(good, seq=-1)),
    ],
)
def test_one_poison_audit_among_300_is_dead_lettered_and_the_rest_stored(chdb_client, ch_database, name, poison_of):
    sink = ClickHouseSink(chdb_client, ch_database)
    records = _audits(300)
    records.insert(137, poison_of(_audits(1)[0]))
    refused: list[tuple[int, object, str]] = []
    stored = sink.write(Audit.topic, 0, 0, len(records) - 1, records,
                        on_poison=lambda i, r, reason: refused.append((i, r, reason)))
    assert stored == 300
    assert [(i, r) for i, r, _ in refused] == [(137, records[137])], name
    assert "DB::Exception" in refused[0][2] or "Error" in refused[0][2]  # ClickHouse's (or Arrow's) own words
    assert sink.count("audit_index") == 300
    assert sink.poison_records == 1


def test_a_redelivered_batch_is_cut_the_same_way_and_stored_once(chdb_client, ch_database):
    records = _audits(200)
    records.insert(50, msgspec.structs.replace(records[50], event_id="not-a-uuid"))
    records.insert(160, msgspec.structs.replace(records[160], event_id="also-not-a-uuid"))
    first = ClickHouseSink(chdb_client, ch_database)
    assert first.write(Audit.topic, 2, 1000, 1201, records, on_poison=lambda *a: None) == 200
    # a crash before the offset commit: a new process (no memory of recent ids) gets the same batch
    second = ClickHouseSink(chdb_client, ch_database, apply_migrations=False)
    refused: list[int] = []
    second.write(Audit.topic, 2, 1000, 1201, records, on_poison=lambda i, r, reason: refused.append(i))
    assert refused == [50, 160]
    assert _raw_count(chdb_client, ch_database, "audit_index") == 200, "a good half was inserted twice"


class Crash(BaseException):
    """A SIGKILL in the middle of a bisection: nothing after it runs, no handler sees it."""


def test_a_crash_mid_bisection_then_a_redelivery_without_the_recent_ids_loses_nothing(chdb_client, ch_database):
    """The first delivery leaves out an event stored lately (recent ids), the redelivery after a crash
    (fresh memory) does not. The batch was cut after that filter, so the same cut positions covered
    other rows on redelivery, and a piece token reused by position dropped a row never stored. Now the
    cut is of the whole batch (same on every delivery), and the filter applies inside each piece."""
    good = _audits(5)
    duplicate, poison = good[3], msgspec.structs.replace(_audits(1)[0], event_id="not-a-uuid")
    batch = [*good[:4], poison, good[4]]  # good[3] arrives again, at another offset
    first = ClickHouseSink(chdb_client, ch_database)
    first.write(Audit.topic, 0, 10, 10, [duplicate])  # stored earlier, and remembered
    stored_pieces = 0
    real_insert = first._insert_part

    def insert_then_crash(table, records, token):
        nonlocal stored_pieces
        if stored_pieces == 1:
            raise Crash()  # the process dies after the first piece of the cut is stored
        real_insert(table, records, token)
        stored_pieces += 1

    first._insert_part = insert_then_crash
    with pytest.raises(Crash):
        first.write(Audit.topic, 0, 20, 25, batch, on_poison=lambda *a: None)

    # no memory of recent ids: a restart past the seed window (within it, the new sink would read back
    # that another batch stored good[3], and drop it: tests/unit/sinks/test_recent_ids.py)
    second = ClickHouseSink(chdb_client, ch_database, apply_migrations=False, seed_window_s=0)
    refused: list[int] = []
    second.write(Audit.topic, 0, 20, 25, batch, on_poison=lambda i, r, reason: refused.append(i))
    assert refused == [4]
    rows = dict(chdb_client.query(f"SELECT request_id, count() FROM {ch_database}.audit_index "
                                  "GROUP BY request_id").result_rows)
    assert set(rows) == {a.request_id for a in good}
    # the piece stored before the crash is dropped by its token, not inserted twice (rollups count rows);
    # the replayed event is stored again: the memory that knew it died with the process
    assert [rows[a.request_id] for a in good] == [1, 1, 1, 2, 1]


def test_the_issue_cases_that_fail_only_in_clickhouse_or_arrow(chdb_client, ch_database):
    sink = ClickHouseSink(chdb_client, ch_database)
    spans = [_span(request_id=f"s{i}") for i in range(20)]
    spans[3] = _span(prompt_tokens=-5)
    spans[11] = _span(seq=-1)
    refused: dict[int, str] = {}
    assert sink.write(Span.topic, 0, 0, 19, spans, on_poison=lambda i, r, reason: refused.setdefault(i, reason)) == 18
    assert sorted(refused) == [3, 11]
    feedback = [Feedback(**stamper.stamp(), request_id=f"f{i}", rating=1) for i in range(10)]
    feedback[4] = msgspec.structs.replace(feedback[4], rating=1000)
    refused.clear()
    assert sink.write(Feedback.topic, 0, 0, 9, feedback, on_poison=lambda i, r, reason: refused.setdefault(i, reason)) == 9
    assert list(refused) == [4] and "1000" in refused[4]


def test_without_a_handler_the_rest_is_stored_and_the_poison_raised(chdb_client, ch_database):
    sink = ClickHouseSink(chdb_client, ch_database)
    records = _audits(10)
    records[7] = msgspec.structs.replace(records[7], event_id="nope")
    with pytest.raises(PoisonRecordsError) as caught:
        sink.write(Audit.topic, 0, 0, 9, records)
    assert [i for i, _, _ in caught.value.records] == [7]
    assert sink.count("audit_index") == 9


# --- the bisection itself: tokens, and failures that are not any record's ------------------------------
def test_halves_take_tokens_derived_from_the_parent():
    calls: list[tuple[list[int], str]] = []

    def insert(items, token):
        calls.append((list(items), token))
        if 5 in items:
            raise DatabaseError("Code: 53. DB::Exception: Type mismatch")

    poison = insert_isolating_poison(list(range(8)), "t/0/0-7", insert)
    assert [(p.index, p.item) for p in poison] == [(5, 5)]
    assert "Code: 53" in poison[0].reason
    stored = [(items, token) for items, token in calls if 5 not in items]
    assert stored == [([0, 1, 2, 3], "t/0/0-7/0"), ([4], "t/0/0-7/1/0/0"), ([6, 7], "t/0/0-7/1/1")]


def test_clickhouse_down_is_raised_unchanged_and_nothing_is_dead_lettered():
    def insert(items, token):
        raise OperationalError("Error HTTPConnectionPool(host='ch', port=8123): connection refused")

    with pytest.raises(OperationalError):
        insert_isolating_poison(list(range(100)), "t", insert)


@pytest.mark.parametrize("code", [241, 243, 60, 164])
def test_server_side_failures_are_raised_unchanged(code):
    def insert(items, token):
        raise DatabaseError(f"Code: {code}. DB::Exception: the server is unwell")

    with pytest.raises(DatabaseError):
        insert_isolating_poison(list(range(100)), "t", insert)


def test_a_batch_where_no_record_can_be_stored_is_not_dead_lettered():
    calls = 0

    def insert(items, token):
        nonlocal calls
        calls += 1
        raise DatabaseError("Code: 999. DB::Exception: something about every row")

    with pytest.raises(SystemicInsertError, match="more than 16 records"):
        insert_isolating_poison(list(range(10_000)), "t", insert)
    assert calls < 400  # bounded: the bisection gives up instead of trying 20,000 inserts
    with pytest.raises(SystemicInsertError, match="none of 4 records"):
        insert_isolating_poison(list(range(4)), "t", insert)
