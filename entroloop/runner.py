"""The embedded runner: the whole pipeline in one process, no services.

Serving-side code publishes encoded records onto the embedded bus (``entroloop.infra.bus.LocalLog``);
``drain`` then consumes every topic partition by partition in offset-aligned batches, exactly as
the Kafka workers and sinks do: decode (poison bytes become dead letters), run the processors
subscribed to the record type and publish what they emit, write the batch to ClickHouse (and the
audit and actions topics to the write-once Parquet log), and only then commit the offsets. Because
batches are cut at multiples of ``batch_size``, re-reading a log cuts the same batches, so insert
deduplication tokens and audit object keys repeat and redelivery stores nothing twice.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from entroloop.contract.codec import CodecError, dead_letter_fields, decode, encode
from entroloop.contract.ids import derived_event_id
from entroloop.contract.records import DeadLetter, Event
from entroloop.contract.settings import Settings
from entroloop.contract.topics import TOPIC_BY_NAME, TOPICS, topic_of
from entroloop.infra.bus import LocalLog, OffsetStore
from entroloop.infra.clickhouse.client import connect
from entroloop.infra.worm.stores import open_worm_store
from sinks.audit.parquet_writer import AuditParquetWriter
from sinks.clickhouse.writer import ClickHouseSink
from streams.actions import ActionRunner, client_query
from streams.base import Processor
from streams.defaults import default_processors

RUNNER_NODE = "embedded-runner"
# At the end of a finite input, event time jumps this far past the last event: further than any
# window plus its grace, so every window closes.
END_OF_STREAM_SLACK_S = 24 * 3600.0


class EmbeddedRunner:
    def __init__(
        self,
        settings: Settings,
        processors: Sequence[Processor] | None = None,
        batch_size: int | None = None,
    ) -> None:
        self.settings = settings
        self.data_dir = Path(settings.data_dir)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log = LocalLog(self.data_dir / "log", settings.partitions)
        self.offsets = OffsetStore(self.data_dir / "offsets.json")
        self.processors = list(default_processors(settings) if processors is None else processors)
        self.batch_size = batch_size or settings.audit_batch_records
        self.clickhouse = ClickHouseSink(
            connect(settings.resolved_clickhouse_dsn(), settings.clickhouse_password.get_secret_value()),
            settings.clickhouse_database,
        )
        self.audit = AuditParquetWriter(open_worm_store(settings, create_bucket=True))
        if processors is None and Path(settings.actions_runbooks_dir).is_dir():
            # alert actions read recent anomalous requests back from ClickHouse for case bundles
            self.processors.append(ActionRunner.from_settings(settings, query=client_query(self.clickhouse.client)))
        self.published: Counter[str] = Counter()
        self.dead_letter_reasons: Counter[str] = Counter()
        self._routes: dict[type, list[Processor]] = defaultdict(list)
        for processor in self.processors:
            for record_type in processor.inputs:
                self._routes[record_type].append(processor)
        self._watermark = 0.0
        self._max_event_time = 0.0

    # --- producing -------------------------------------------------------------------------------
    def publish(self, record: Event) -> bool:
        """Encode and append ``record`` to its topic; False if the topic already holds its event id."""
        topic = topic_of(record).name
        if self.log.append(topic, record.request_id, encode(record), record.event_id) is None:
            return False
        self.published[topic] += 1
        return True

    def publish_raw(self, topic: str, key: str, value: bytes) -> None:
        """Append bytes as a foreign producer would (used to inject malformed records)."""
        self.log.append(topic, key, value)

    # --- consuming -------------------------------------------------------------------------------
    def drain(self, on_batch: Callable[[str, int], None] | None = None, end_of_stream: bool = False) -> int:
        """Consume until every topic partition is at its end; return the number of messages read.

        ``end_of_stream``: the input is finite (a demo, a replay), so advance event time past every
        open window and let windowed processors emit their last results.
        """
        total = 0
        while True:
            if not self._pending() and end_of_stream and self._watermark < self._end_time:
                self._watermark = self._end_time
                for out in self._fire_watermark():
                    self.publish(out)
            progressed = 0
            for topic in TOPICS:
                for partition in range(self.settings.partitions):
                    progressed += self._drain_partition(topic.name, partition, on_batch)
            if not progressed:
                break
            total += progressed
            for out in self._fire_watermark():
                self.publish(out)
        self.log.flush()
        self.offsets.save()
        return total

    def _pending(self) -> bool:
        return any(
            self.offsets.get(t.name, p) < self.log.end_offset(t.name, p)
            for t in TOPICS
            for p in range(self.settings.partitions)
        )

    @property
    def _end_time(self) -> float:
        return self._max_event_time + END_OF_STREAM_SLACK_S

    def _drain_partition(self, topic: str, partition: int, on_batch: Callable[[str, int], None] | None) -> int:
        start = self.offsets.get(topic, partition)
        end = self.log.end_offset(topic, partition)
        read = 0
        while start < end:
            stop = min(end, (start // self.batch_size + 1) * self.batch_size)
            self._process_batch(topic, partition, start, self.log.read(topic, partition, start, stop))
            self.offsets.commit(topic, partition, stop)  # only after the durable writes above
            self.offsets.save()
            read += stop - start
            if on_batch:
                on_batch(topic, stop - start)
            start = stop
        return read

    def _process_batch(self, topic: str, partition: int, first: int, frames: list[tuple[str, bytes]]) -> None:
        records: list[Event] = []
        offsets: list[int] = []
        for i, (key, value) in enumerate(frames):
            try:
                record = decode(value, self.settings.max_record_bytes)
            except CodecError as err:
                self.publish(self._dead_letter(topic, partition, first + i, key, value, err))
                continue
            if not isinstance(record, TOPIC_BY_NAME[topic].record_type):
                err = CodecError(f"a {type(record).__name__} record on topic {topic}")
                err.error_type = "wrong_topic"
                self.publish(self._dead_letter(topic, partition, first + i, key, value, err))
                continue
            records.append(record)
            offsets.append(first + i)
            self._watermark = max(self._watermark, record.emitted_at)
            self._max_event_time = max(self._max_event_time, record.emitted_at)
        last = first + len(frames) - 1
        if records:
            self.clickhouse.write(topic, partition, first, last, records)
            if topic in self.audit.topics:
                self._write_audit_log(topic, partition, first, last, offsets, records)
        by_type: dict[type, list[Event]] = defaultdict(list)
        for record in records:
            by_type[type(record)].append(record)
        for record_type, group in by_type.items():
            for processor in self._routes.get(record_type, ()):
                for out in processor.process_batch(group):
                    self.publish(out)

    def _write_audit_log(
        self, topic: str, partition: int, first: int, last: int, offsets: list[int], records: list[Event]
    ) -> None:
        """Write a batch of a logged topic (audit, actions) to the write-once log, minus what it holds.

        Topics the processors write to (actions) grow while the log is drained, so a batch re-read
        after a crash between the write and the offset commit can be cut longer than the batch
        written before it; the chain refuses overlapping batches, so the records it already holds
        are left out and the rest is written as the batch that follows them.
        """
        chained = self.audit.chain(topic, partition).last_offset
        if first <= chained < last:
            records = [r for o, r in zip(offsets, records) if o > chained]
            first = chained + 1
        if records:
            self.audit.write(topic, partition, first, last, records)

    def _dead_letter(self, topic: str, partition: int, offset: int, key: str, value: bytes, err: CodecError) -> DeadLetter:
        self.dead_letter_reasons[err.error_type] += 1
        at = time.time()
        return DeadLetter(
            event_id=derived_event_id(f"{topic}/{partition}/{offset}", "dead_letter", at=0.0),
            emitted_at=at,
            node_id=RUNNER_NODE,
            seq=offset,
            request_id=key,
            source_topic=topic,
            source_partition=partition,
            source_offset=offset,
            **dead_letter_fields(err, value),
        )

    def _fire_watermark(self) -> Iterable[Event]:
        for processor in self.processors:
            yield from processor.on_watermark(self._watermark)

    # --- replay and results ----------------------------------------------------------------------
    def rewind(self) -> None:
        """Forget committed offsets so the next ``drain`` re-reads every topic from the start."""
        self.offsets.reset()

    def stored_counts(self) -> dict[str, int]:
        """Distinct events stored per topic (ClickHouse rows; audit: records in Parquet files)."""
        return {t.name: self.clickhouse.count(t.table) for t in TOPICS}

    def table_rows(self) -> dict[str, int]:
        return {t.table: self.clickhouse.count(t.table) for t in TOPICS}

    def close(self) -> None:
        self.log.close()
        self.offsets.save()
