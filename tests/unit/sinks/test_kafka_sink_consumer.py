"""KafkaSinkConsumer logic against an in-memory consumer: journal before write, exact replay after a
crash, commit after write, poison to dead letters, pause and resume on backpressure, one write per
table for all its partitions, batch clock from the broker timestamp.

The broker-level behaviour (real groups, SIGKILL, real chDB and audit files) is covered by
tests/integration/test_kafka_sinks.py; here each rule is pinned down in isolation.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import pytest
from confluent_kafka import KafkaError, TopicPartition
from entroloop.collectors.synthetic_fleet import SyntheticFleet
from entroloop.sinks.batching import Slice
from entroloop.sinks.kafka_sink import (
    KafkaSinkConsumer,
    Pending,
    format_journal,
    parse_journal,
)

from entroloop.contract import codec
from entroloop.contract.records import DeadLetter, TokenEntropy
from entroloop.contract.settings import Settings

TOPIC = TokenEntropy.topic
PREFIX = "t."
KTOPIC = PREFIX + TOPIC


class FakeError:
    def __init__(self, code: int) -> None:
        self._code = code

    def code(self) -> int:
        return self._code

    def fatal(self) -> bool:
        return False


@dataclass
class FakeMessage:
    _offset: int
    _value: bytes | None
    _partition: int = 0
    _topic: str = KTOPIC
    _error: Any = None
    _timestamp_ms: int = -1  # the broker's append time; -1: none given

    def timestamp(self) -> tuple[int, int]:
        return (1, self._timestamp_ms) if self._timestamp_ms >= 0 else (0, -1)

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes | None:
        return self._value

    def key(self) -> bytes:
        return b"k"

    def error(self) -> Any:
        return self._error


@dataclass
class FakeConsumer:
    committed_offsets: dict[tuple[str, int], tuple[int, str]] = field(default_factory=dict)
    commits: list[tuple[int, str]] = field(default_factory=list)
    requests: int = 0  # commit calls (each may carry several partitions)
    paused: list[tuple[str, int]] = field(default_factory=list)
    seeks: list[tuple[str, int, int]] = field(default_factory=list)
    resumed: list[tuple[str, int]] = field(default_factory=list)

    def commit(self, offsets: list[TopicPartition], asynchronous: bool = True) -> None:
        assert asynchronous is False, "sinks commit synchronously"
        self.requests += 1
        for tp in offsets:
            self.committed_offsets[(tp.topic, tp.partition)] = (tp.offset, tp.metadata or "")
            self.commits.append((tp.offset, tp.metadata or ""))

    def committed(self, partitions: list[TopicPartition], timeout: float = 0) -> list[TopicPartition]:
        out = []
        for tp in partitions:
            offset, metadata = self.committed_offsets.get((tp.topic, tp.partition), (-1001, ""))
            out.append(TopicPartition(tp.topic, tp.partition, offset, metadata))
        return out

    def pause(self, tps: list[TopicPartition]) -> None:
        self.paused += [(tp.topic, tp.partition) for tp in tps]

    def seek(self, tp: TopicPartition) -> None:
        self.seeks.append((tp.topic, tp.partition, tp.offset))

    def resume(self, tps: list[TopicPartition]) -> None:
        self.resumed += [(tp.topic, tp.partition) for tp in tps]


@dataclass
class FakeProducer:
    produced: list[tuple[str, bytes]] = field(default_factory=list)
    unflushed: int = 0
    flushes: int = 0

    def produce(self, topic: str, key: bytes, value: bytes, on_delivery: Any = None) -> None:
        self.produced.append((topic, value))
        self.unflushed += 1

    def poll(self, timeout: float) -> int:
        return 0

    def flush(self, timeout: float = 0) -> int:
        self.flushes += 1
        self.unflushed = 0
        return 0


class RecordingTarget:
    """Writes (topic, partition, first, last, n) and what the consumer had committed at that moment."""

    def __init__(self, consumer: FakeConsumer) -> None:
        self.consumer = consumer
        self.writes: list[tuple[str, int, int, int, int]] = []
        self.journal_at_write: list[tuple[int, str]] = []
        self.fail = False

    def write(self, topic: str, partition: int, first: int, last: int, records: list[Any]) -> int:
        if self.fail:
            raise ConnectionError("ClickHouse is down")
        self.writes.append((topic, partition, first, last, len(records)))
        self.journal_at_write.append(self.consumer.committed_offsets.get((KTOPIC, partition), (-1, ""))[:2])
        return len(records)


def tokens(n: int) -> list[bytes]:
    records = [r for q in SyntheticFleet(seed=3).requests(n) for r in q.records if isinstance(r, TokenEntropy)]
    return [codec.encode(r) for r in records[:n]]


class SlicesTarget(RecordingTarget):
    """Takes several partitions per write (like ClickHouseSink): records each write's members."""

    def __init__(self, consumer: FakeConsumer) -> None:
        super().__init__(consumer)
        self.batches: list[tuple[tuple[int, int, int, int], ...]] = []

    def write_slices(self, topic: str, slices: list[Slice], on_poison: Any = None) -> int:
        if self.fail:
            raise ConnectionError("ClickHouse is down")
        self.batches.append(tuple((s.partition, s.first, s.last, len(s.records)) for s in slices))
        return sum(len(s.records) for s in slices)


def make_sink(committed: dict | None = None, partitions: tuple[int, ...] = (0,), target_type: type = RecordingTarget,
              **options: Any) -> tuple[KafkaSinkConsumer, FakeConsumer, FakeProducer, Any]:
    settings = Settings(kafka_bootstrap="127.0.0.1:1", topic_prefix=PREFIX)
    consumer, producer = FakeConsumer(dict(committed or {})), FakeProducer()
    target = target_type(consumer)
    sink = KafkaSinkConsumer("test", target, [TOPIC], settings, **options)
    sink.consumer, sink.producer = consumer, producer  # in-memory stand-ins for librdkafka
    sink._on_assign(consumer, [TopicPartition(KTOPIC, p) for p in partitions])
    return sink, consumer, producer, target


def messages(values: list[bytes], start: int, partition: int = 0, appended_ms: int = -1) -> list[FakeMessage]:
    return [FakeMessage(start + i, v, partition, _timestamp_ms=appended_ms) for i, v in enumerate(values)]


def test_journal_round_trip_and_rejections() -> None:
    alone = [Pending(10, 19, ((0, 10, 19),)), Pending(20, 35, ((0, 20, 35),))]
    assert format_journal(alone) == "entroloop-pending:10-19,20-35"  # the one-partition format is unchanged
    assert parse_journal(format_journal(alone), 10, 0) == alone
    assert parse_journal(format_journal(alone), 20, 0) == alone[1:]  # first range committed since
    shared = [Pending(10, 19, ((0, 10, 19), (3, 500, 640)))]
    assert format_journal(shared) == "entroloop-pending:10-19@0:10-19+3:500-640"
    assert parse_journal(format_journal(shared), 10, 0) == shared
    assert parse_journal("entroloop-pending:10-19@3:500-640", 10, 0) == []  # the batch must name this range
    assert parse_journal("entroloop-pending:10-19@0:10-19+x", 10, 0) == []  # junk member
    assert parse_journal("entroloop-pending:10-19,25-30", 10, 0) == []  # not a chain: not trusted
    assert parse_journal("entroloop-pending:12-19", 10, 0) == []  # does not start at the committed offset
    assert parse_journal("something else", 10, 0) == [] and parse_journal(None, 10, 0) == []
    assert format_journal([]) == ""


def test_range_is_journaled_before_it_is_written_and_committed_after() -> None:
    sink, consumer, _, target = make_sink(max_rows=10, max_seconds=60, buffer_rows=100)
    sink._take(messages(tokens(25), 0))
    sink._flush(force=False)  # 25 rows >= 10: due
    assert [(w[2], w[3]) for w in target.writes] == [(0, 9)]
    # at the moment of the write the group's offset was still 0, with the range in its metadata
    assert target.journal_at_write == [(0, "entroloop-pending:0-9")]
    assert consumer.committed_offsets[(KTOPIC, 0)] == (10, "")
    sink._flush(force=True)
    assert [(w[2], w[3]) for w in target.writes] == [(0, 9), (10, 19), (20, 24)]
    assert consumer.committed_offsets[(KTOPIC, 0)] == (25, "")


def test_restart_rewrites_the_journaled_ranges_exactly() -> None:
    # a crash after writing 100-129 (and journaling 130-139) but before committing
    committed = {(KTOPIC, 0): (100, "entroloop-pending:100-129,130-139")}
    sink, consumer, _, target = make_sink(committed, max_rows=1000, max_seconds=60)
    values = tokens(60)
    sink._take(messages(values[:20], 100))
    sink._take(messages(values[20:], 120))
    sink._flush(force=True)
    # the journaled ranges first, cut as before the crash (same tokens), then the rest as a new batch
    assert [(w[2], w[3]) for w in target.writes] == [(100, 129), (130, 139), (140, 159)]
    assert consumer.committed_offsets[(KTOPIC, 0)] == (160, "")
    assert sink.stats.replayed_rows == 40 and sink.stats.replayed_ranges == 2


def test_retry_after_a_failed_write_keeps_the_journaled_cut() -> None:
    sink, consumer, _, target = make_sink(max_rows=1000, max_seconds=0.0)
    values = tokens(30)
    sink._take(messages(values[:10], 0))
    target.fail = True
    sink._flush(force=True)  # journal 0-9 committed, then the write fails
    assert consumer.committed_offsets[(KTOPIC, 0)] == (0, "entroloop-pending:0-9")
    target.fail = False
    sink._take(messages(values[10:], 10))
    sink._flush(force=True)
    # the retry covers 0-29 but is split along the journal: 0-9 with its token, then 10-29
    assert [(w[2], w[3]) for w in target.writes] == [(0, 9), (10, 29)]
    assert consumer.committed_offsets[(KTOPIC, 0)] == (30, "")


def test_poison_becomes_a_dead_letter_delivered_before_the_commit() -> None:
    sink, consumer, producer, target = make_sink(max_rows=1000, max_seconds=60)
    values = tokens(4)
    batch = [*values[:2], b"\xc1 poison", *values[2:]]
    sink._take(messages(batch, 0))
    assert len(producer.produced) == 1
    topic, value = producer.produced[0]
    assert topic == PREFIX + DeadLetter.topic
    dead = codec.decode(value)
    assert isinstance(dead, DeadLetter) and dead.source_offset == 2 and dead.error_type == "malformed"
    sink._flush(force=True)
    assert [(w[2], w[3], w[4]) for w in target.writes] == [(0, 4, 4)]  # the range covers the poison offset
    assert producer.flushes >= 1 and producer.unflushed == 0
    assert consumer.committed_offsets[(KTOPIC, 0)] == (5, "")


def test_only_poison_is_committed_past_once_delivered() -> None:
    sink, consumer, producer, target = make_sink(max_rows=1000, max_seconds=60)
    sink._take(messages([b"junk", b"\x92\x01"], 0))
    assert target.writes == [] and len(producer.produced) == 2
    assert consumer.committed_offsets[(KTOPIC, 0)] == (2, "")


def test_backpressure_pauses_seeks_back_and_resumes() -> None:
    sink, consumer, _, target = make_sink(max_rows=10, max_seconds=60, buffer_rows=20)
    values = tokens(50)
    target.fail = True  # ClickHouse down: the buffer fills
    sink._take(messages(values[:30], 0))
    assert consumer.paused == [(KTOPIC, 0)]
    assert consumer.seeks == [(KTOPIC, 0, 20)], "what did not fit is fetched again from its offset"
    sink._take(messages(values[30:], 30))  # fetched before the pause took effect: ignored
    sink._flush(force=False)
    sink._resume_drained()
    assert consumer.resumed == []  # still full
    target.fail = False
    sink._batcher.flush_all()  # the batcher's backoff elapsed; writes go through
    sink._resume_drained()
    assert consumer.resumed == [(KTOPIC, 0)]
    sink._take(messages(values[20:], 20))  # redelivered from the seek offset; 20 fit, pause at 40
    assert consumer.seeks[-1] == (KTOPIC, 0, 40)
    sink._flush(force=True)
    sink._resume_drained()
    sink._take(messages(values[40:], 40))
    sink._flush(force=True)
    written = sorted((w[2], w[3]) for w in target.writes)
    assert written[0][0] == 0 and written[-1][1] == 49
    assert sum(w[4] for w in target.writes) == 50


def test_one_write_per_table_covers_every_partition_with_one_journal_and_one_commit() -> None:
    sink, consumer, _, target = make_sink(partitions=(0, 1, 2), target_type=SlicesTarget, max_rows=1000, max_seconds=60)
    values = tokens(30)
    for p in (0, 1, 2):
        sink._take(messages(values[10 * p:10 * p + 10], 100 * p, partition=p))
    requests = consumer.requests
    sink._flush(force=True)
    assert target.batches == [((0, 0, 9, 10), (1, 100, 109, 10), (2, 200, 209, 10))]  # one insert, three ranges
    assert consumer.requests - requests == 2, "one journal commit and one offset commit for the three partitions"
    members = "0:0-9+1:100-109+2:200-209"
    # each partition's journal named the whole batch, so any next owner can rewrite it whole
    assert consumer.commits[-6:-3] == [(0, f"entroloop-pending:0-9@{members}"),
                                       (100, f"entroloop-pending:100-109@{members}"),
                                       (200, f"entroloop-pending:200-209@{members}")]
    assert [consumer.committed_offsets[(KTOPIC, p)] for p in (0, 1, 2)] == [(10, ""), (110, ""), (210, "")]
    assert sink.stats.writes_by_topic == {TOPIC: 1}


def test_tables_due_together_share_one_journal_commit_and_one_offset_commit() -> None:
    from entroloop.contract.records import Span

    settings = Settings(kafka_bootstrap="127.0.0.1:1", topic_prefix=PREFIX)
    consumer, producer = FakeConsumer(), FakeProducer()
    target = SlicesTarget(consumer)
    sink = KafkaSinkConsumer("test", target, [TOPIC, Span.topic], settings, max_rows=1000, max_seconds=60)
    sink.consumer, sink.producer = consumer, producer
    span_topic = PREFIX + Span.topic
    sink._on_assign(consumer, [TopicPartition(t, p) for t in (KTOPIC, span_topic) for p in (0, 1)])
    spans = [codec.encode(r) for q in SyntheticFleet(seed=4).requests(10) for r in q.records if isinstance(r, Span)]
    values = tokens(8)
    for p in (0, 1):
        sink._take(messages(values[4 * p:4 * p + 4], 0, partition=p))
        sink._take([FakeMessage(i, v, p, span_topic) for i, v in enumerate(spans[3 * p:3 * p + 3])])
    requests = consumer.requests
    sink._flush(force=True)
    assert sorted(target.batches) == sorted([((0, 0, 3, 4), (1, 0, 3, 4)), ((0, 0, 2, 3), (1, 0, 2, 3))])
    assert consumer.requests - requests == 2, "two tables, four partitions: one journal commit, one offset commit"
    assert all(consumer.committed_offsets[(t, p)][1] == "" for t in (KTOPIC, span_topic) for p in (0, 1))


def test_a_batch_pending_on_a_partition_owned_elsewhere_is_rewritten_whole_from_kafka() -> None:
    # a crashed sink journaled 0:0-9 + 1:100-109 and wrote it; this sink now owns partition 0 only
    members = "0:0-9+1:100-109"
    committed = {(KTOPIC, 0): (0, f"entroloop-pending:0-9@{members}"),
                 (KTOPIC, 1): (100, f"entroloop-pending:100-109@{members}")}
    sink, consumer, _, target = make_sink(committed, partitions=(0,), target_type=SlicesTarget, max_rows=1000,
                                          max_seconds=60)
    values = tokens(25)
    reads: list[tuple[int, int, int]] = []

    def read_range(kafka_topic: str, partition: int, first: int, last: int) -> list[tuple[int, Any]]:
        reads.append((partition, first, last))
        return [(100 + i, codec.decode(v)) for i, v in enumerate(values[15:25])]

    sink._read_range = read_range  # type: ignore[method-assign]  # stands in for a group-less Kafka read
    sink._take(messages(values[:15], 0))
    sink._flush(force=True)
    assert reads == [(1, 100, 109)]
    # the same members as journaled (same token), then the rest of partition 0 as a new batch
    assert target.batches == [((0, 0, 9, 10), (1, 100, 109, 10)), ((0, 10, 14, 5),)]
    assert consumer.committed_offsets[(KTOPIC, 0)] == (15, "")
    assert consumer.committed_offsets[(KTOPIC, 1)][0] == 100, "not ours: its owner commits it"
    assert sink.stats.replayed_rows == 20


def test_a_failed_write_is_retried_with_its_journaled_members_first() -> None:
    sink, consumer, _, target = make_sink(partitions=(0, 1), target_type=SlicesTarget, max_rows=1000, max_seconds=0.0)
    values = tokens(30)
    sink._take(messages(values[:5], 0, partition=0))
    sink._take(messages(values[5:10], 0, partition=1))
    target.fail = True
    sink._flush(force=True)
    assert target.batches == []
    target.fail = False
    sink._take(messages(values[10:20], 5, partition=0))  # more rows arrived meanwhile
    sink._flush(force=True)
    assert target.batches == [((0, 0, 4, 5), (1, 0, 4, 5)), ((0, 5, 14, 10),)]
    assert [consumer.committed_offsets[(KTOPIC, p)] for p in (0, 1)] == [(15, ""), (5, "")]


def test_batch_clock_starts_at_the_broker_append() -> None:
    sink, _, _, target = make_sink(partitions=(0, 1), target_type=SlicesTarget, max_rows=1000, max_seconds=1.0)
    values = tokens(20)
    sink._take(messages(values[:10], 0, partition=0, appended_ms=int(time.time() * 1000)))
    sink._flush(force=False)
    assert target.batches == [], "appended just now: not due"
    assert 0.5 < sink._batcher.next_due_in() <= 1.0
    sink._take(messages(values[10:], 0, partition=1, appended_ms=int((time.time() - 1.5) * 1000)))
    sink._flush(force=False)  # partition 1's rows waited 1.5 s in Kafka: the table is due, both partitions go
    assert target.batches == [((0, 0, 9, 10), (1, 0, 9, 10))]


def test_end_of_partition_marks_it_drained_until_a_message_follows() -> None:
    sink, _, _, _ = make_sink(max_rows=10, max_seconds=60)
    eof = FakeMessage(0, None, _error=FakeError(KafkaError._PARTITION_EOF))
    sink._take([eof])
    assert sink._states[(KTOPIC, 0)].eof
    sink._take([eof, *messages(tokens(1), 0)])
    assert not sink._states[(KTOPIC, 0)].eof


def test_unknown_topic_and_missing_broker_are_refused() -> None:
    with pytest.raises(ValueError, match="no broker"):
        KafkaSinkConsumer("x", object(), [TOPIC], Settings(kafka_bootstrap=""))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown topic"):
        KafkaSinkConsumer("x", object(), ["nope"], Settings(kafka_bootstrap="127.0.0.1:1"))  # type: ignore[arg-type]


def test_prefixes_sharing_a_database_do_not_share_dedup_tokens(chdb_client: Any, ch_database: str) -> None:
    """Same topic, partition and offsets under two prefixes are different rows, both kept."""
    from entroloop.sinks.clickhouse.writer import ClickHouseSink
    from entroloop.sinks.kafka_sink import PrefixedClickHouseTarget

    sink = ClickHouseSink(chdb_client, ch_database)
    records = [r for q in SyntheticFleet(seed=9).requests(20) for r in q.records if isinstance(r, TokenEntropy)]
    tenant_a, tenant_b = PrefixedClickHouseTarget(sink, "a."), PrefixedClickHouseTarget(sink, "b.")
    tenant_a.write(TOPIC, 0, 0, 9, records[:10])
    tenant_b.write(TOPIC, 0, 0, 9, records[10:])
    tenant_a.write(TOPIC, 0, 0, 9, records[:10])  # a redelivery of tenant a: dropped
    rows = chdb_client.query(f"SELECT count() FROM {ch_database}.token_entropy").result_rows[0][0]
    assert rows == 20
