"""TableState: the bad-case join over a (fake) Faust table: buffered writes, changelog partitions,
tombstones on expiry, and a joiner rebuilt from the changelog alone."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from entroloop.streams.bad_cases import BadCaseJoiner, JoinedAudit, JoinEntry
from entroloop.streams.table_state import TableState

from entroloop.contract.records import Audit, BadCase, Feedback

from .analytics_records import audit, feedback

CORRECTION = "余额为150.00元"


class FakeStore(dict):  # type: ignore[type-arg]
    """Like Faust's memory store: a dict that remembers the partition of recovered keys."""

    def __init__(self) -> None:
        super().__init__()
        self._key_partition: dict[bytes, int] = {}


class FakeTable:
    """What TableState uses of a Faust table: ``data`` (the store) and ``send_changelog``."""

    def __init__(self) -> None:
        self.data = FakeStore()
        self.changelog: list[tuple[int, bytes, bytes | None]] = []

    def send_changelog(self, partition: int, key: bytes, value: bytes | None, **_: Any) -> None:
        self.changelog.append((partition, key, value))

    def recover(self, changelog: list[tuple[int, bytes, bytes | None]]) -> None:
        """Replay a changelog as Faust's memory store does (last value wins, None deletes)."""
        for partition, key, value in changelog:
            if value is None:
                self.data.pop(key, None)
                self.data._key_partition.pop(key, None)
            else:
                self.data[key] = value
                self.data._key_partition[key] = partition


def joiner_on(table: FakeTable, ttl_s: float = 7 * 86_400) -> tuple[BadCaseJoiner, TableState[JoinEntry]]:
    state: TableState[JoinEntry] = TableState(table, BadCaseJoiner.table_state)
    return BadCaseJoiner(ttl_s=ttl_s, state=state), state


def test_writes_are_buffered_until_flush_and_sent_to_the_records_partition() -> None:
    table = FakeTable()
    joiner, state = joiner_on(table)
    state.partition = 3
    joiner.process(audit("r1", response="余额为120.00元"))
    assert "r1" in state and table.data == {} and table.changelog == []  # visible, not yet applied
    assert state.flush() == 1
    [(partition, key, value)] = table.changelog
    assert (partition, key) == (3, b"r1") and value is not None and table.data[b"r1"] == value
    assert state["r1"].audit is not None


def test_a_joiner_rebuilt_from_the_changelog_joins_in_both_orders() -> None:
    table = FakeTable()
    joiner, state = joiner_on(table)
    state.partition = 0
    joiner.process(audit("audit-first", response="余额为120.00元"))
    assert joiner.process(feedback("feedback-first", corrected=CORRECTION)) == []
    state.flush()

    restarted = FakeTable()
    restarted.recover(table.changelog)
    joiner2, state2 = joiner_on(restarted)
    state2.partition = 0
    assert len(joiner2.process(feedback("audit-first", corrected=CORRECTION))) == 1
    assert len(joiner2.process(audit("feedback-first", response="余额为120.00元"))) == 1


def test_expiry_writes_a_tombstone_to_the_keys_partition_and_recovery_drops_it() -> None:
    table = FakeTable()
    joiner, state = joiner_on(table, ttl_s=100)
    state.partition = 2
    joiner.process(audit("old", at=1000.0))
    joiner.process(audit("young", at=1200.0))
    state.flush()
    state.partition = None  # expiry runs outside a partition group
    joiner.on_watermark(1200.0)
    assert "old" not in state and "young" in state
    state.flush()
    assert table.changelog[-1] == (2, b"old", None)

    restarted = FakeTable()
    restarted.recover(table.changelog)
    assert set(restarted.data) == {b"young"}
    # A key known only from recovery still gets its tombstone on the partition it came from.
    joiner2, state2 = joiner_on(restarted, ttl_s=100)
    joiner2.on_watermark(1400.0)
    state2.flush()
    assert restarted.changelog == [(2, b"young", None)] and len(state2) == 0


def test_an_entry_created_and_expired_in_one_batch_still_gets_its_tombstone() -> None:
    table = FakeTable()
    joiner, state = joiner_on(table, ttl_s=100)
    state.partition = 1
    joiner.process(audit("old", at=1000.0))
    state.partition = None
    joiner.on_watermark(1200.0)  # before any flush: the partition comes from the pending write
    state.flush()
    assert table.changelog == [(1, b"old", None)] and table.data == {}


def test_delete_of_a_missing_key_raises_and_a_key_without_partition_is_refused_at_write() -> None:
    table = FakeTable()
    _, state = joiner_on(table)
    with pytest.raises(KeyError):
        del state["nope"]
    with pytest.raises(RuntimeError):
        state["k"] = JoinEntry()  # no partition known for a brand-new key outside a group


def test_get_sees_what_indexing_sees_and_a_default_for_keys_not_held() -> None:
    table = FakeTable()
    table.recover([(1, b"recovered", BadCaseJoiner.table_state.encode(JoinEntry(last_seen=1.0)))])
    state: TableState[JoinEntry] = TableState(table, BadCaseJoiner.table_state)
    state.partition = 1
    state["pending"] = JoinEntry(last_seen=2.0)
    state["sealed"] = JoinEntry(last_seen=3.0)
    state.seal()
    state["gone"] = JoinEntry()
    del state["gone"]
    for key in ("recovered", "pending", "sealed"):
        assert state.get(key) == state[key] and state.get(key).last_seen > 0  # type: ignore[union-attr]
    marker = JoinEntry(last_seen=-1.0)
    assert state.get("gone") is None and state.get("never", marker) is marker


def test_a_changelog_written_with_whole_audits_reads_back_and_joins() -> None:
    # Until the join kept a JoinedAudit, each entry held the whole Audit record: a worker upgraded
    # over such a changelog must read those entries and still join their corrections.
    class WholeAuditEntry(msgspec.Struct):
        audit: Audit | None = None
        waiting_feedback: list[Feedback] = []
        joined_feedback: list[Feedback] = []
        last_seen: float = 0.0

    answer = audit("old-entry", response="余额为120.00元")
    table = FakeTable()
    whole = msgspec.msgpack.encode(WholeAuditEntry(audit=answer, last_seen=answer.emitted_at))
    table.recover([(0, b"old-entry", whole)])
    joiner, state = joiner_on(table)
    state.partition = 0
    entry = state["old-entry"]
    assert entry.audit == JoinedAudit.of(answer) and entry.last_seen == answer.emitted_at
    [case] = joiner.process(feedback("old-entry", corrected=CORRECTION))
    assert isinstance(case, BadCase) and case.audit_id == answer.audit_id and case.model == answer.model
    assert state.flush() == 1
    [(_, key, rewritten)] = table.changelog
    assert key == b"old-entry" and rewritten is not None and len(rewritten) < len(whole)  # written back slim
