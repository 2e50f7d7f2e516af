"""The embedded runner: the whole pipeline in one process, no services.

Serving-side code publishes encoded records onto the embedded bus (``entroloop.infra.bus.LocalLog``);
``drain`` then consumes every topic partition by partition in offset-aligned batches, exactly as
the Kafka workers and sinks do: decode (poison bytes become dead letters), run the processors
subscribed to the record type and publish what they emit, write the batch to ClickHouse (and the
audit and actions topics to the write-once Parquet log), and only then commit the offsets.

Crash consistency (SIGKILL at any instruction, then ``entroloop replay``): each drain step first
makes the log durable (so nothing is stored that the bus could lose), journals where it cuts its
batches (``BatchCuts``: a re-read cuts the same batches, so insert deduplication tokens and audit
object keys repeat and neither raw tables nor the per-minute rollups count a record twice), stores
and processes the batches, makes the derived records durable, and only then saves the offsets.
``ENTROLOOP_FAULT_KILL_EMBEDDED=POINT:N`` (tests only) SIGKILLs the process the N-th time it
reaches POINT (see ``CRASH_POINTS``).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from entroloop.contract.codec import (
    CodecError,
    EventTimeWindow,
    dead_letter_at,
    decode,
    encode,
)
from entroloop.contract.records import DeadLetter, Event
from entroloop.contract.settings import Settings
from entroloop.contract.topics import TOPIC_BY_NAME, TOPICS, topic_of
from entroloop.infra.bus import BatchCuts, LocalLog, OffsetStore
from entroloop.infra.clickhouse.client import connect
from entroloop.infra.private_files import make_private_dir
from entroloop.infra.quarantine import quarantine_from_settings
from entroloop.infra.worm.stores import open_worm_store
from entroloop.sinks.audit.checkpointer import checkpointer_from_settings
from entroloop.sinks.audit.parquet_writer import AuditParquetWriter
from entroloop.sinks.clickhouse.writer import ClickHouseSink
from entroloop.streams.actions import ActionRunner, client_query
from entroloop.streams.actions.runbooks import runbooks_from_settings
from entroloop.streams.base import Processor
from entroloop.streams.defaults import default_processors
from entroloop.streams.windowing import event_time_ceiling

RUNNER_NODE = "embedded-runner"
# At the end of a finite input, event time jumps this far past the last event: further than any
# window plus its grace, so every window closes.
END_OF_STREAM_SLACK_S = 24 * 3600.0

# The count column of each per-minute rollup: one per record of its raw table.
ROLLUP_COUNTS = {
    "entropy_1m": "chunks", "latency_1m": "spans", "similarity_1m": "scores", "anomalies_1m": "alerts",
    "fallbacks_1m": "fallbacks", "bad_cases_1m": "bad_cases", "requests_1m": "requests", "feedback_1m": "feedback",
}

FAULT_KILL_ENV = "ENTROLOOP_FAULT_KILL_EMBEDDED"
# Where the fault hook can kill a drain: after a batch's ClickHouse insert (before its audit
# write), after a batch was stored and processed (its outputs not yet durable), after a step's
# outputs were flushed (before its offsets were saved), after the offsets were saved.
CRASH_POINTS = ("insert", "batch", "flushed", "committed")


class CrashPoints:
    """The test-only fault hook: ``ENTROLOOP_FAULT_KILL_EMBEDDED=POINT:N`` SIGKILLs at POINT's N-th pass.

    Read once, here only; off (and free) when the variable is unset.
    """

    def __init__(self, value: str | None = None) -> None:
        value = os.environ.get(FAULT_KILL_ENV, "") if value is None else value
        point, _, n = value.strip().partition(":")
        if value.strip() and (point not in CRASH_POINTS or not n.isdigit() or int(n) < 1):
            raise ValueError(f"{FAULT_KILL_ENV}={value!r}: expected POINT:N with POINT one of {CRASH_POINTS}, N >= 1")
        self.point, self.after = (point, int(n)) if value.strip() else ("", 0)
        self.passes = 0

    def reached(self, point: str) -> None:
        if point != self.point:
            return
        self.passes += 1
        if self.passes >= self.after:
            print(f"fault: SIGKILL at {point} #{self.passes}", file=sys.stderr, flush=True)
            os.kill(os.getpid(), signal.SIGKILL)


class EmbeddedRunner:
    def __init__(
        self,
        settings: Settings,
        processors: Sequence[Processor] | None = None,
        batch_size: int | None = None,
    ) -> None:
        self.settings = settings
        if processors is None:
            runbooks_from_settings(settings)  # a bad ENTROLOOP_ACTIONS_RUNBOOKS_DIR fails before any store opens
        self.data_dir = Path(settings.data_dir)
        make_private_dir(self.data_dir)  # prompts, answers and audit text live below: 0700
        self.log = LocalLog(self.data_dir / "log", settings.partitions)
        self.offsets = OffsetStore(self.data_dir / "offsets.json")
        self.processors = list(default_processors(settings) if processors is None else processors)
        self.batch_size = batch_size or settings.audit_batch_records
        self._time_window = EventTimeWindow.from_settings(settings)  # decode refuses events outside it
        self.cuts = BatchCuts(self.data_dir / "batch_cuts.json", self.batch_size)
        self._crash = CrashPoints()
        # raw bytes of dead letters: write-once, read by id (`entroloop audit quarantine ID`), never a table
        self.quarantine = quarantine_from_settings(settings)
        dsn = settings.resolved_clickhouse_dsn()
        self.clickhouse = ClickHouseSink(
            connect(dsn, settings.clickhouse_password.get_secret_value()),
            settings.clickhouse_database,
            quarantine=self.quarantine,
            embedded=dsn.startswith("chdb://"),
        )
        worm = open_worm_store(settings, create_bucket=True)
        # signed checkpoints of the chain heads (ENTROLOOP_AUDIT_SIGNING_KEY_FILE) go to this runner's
        # own ClickHouse, among other anchors: a chDB folder belongs to the process that opened it
        self.audit = AuditParquetWriter(worm, checkpointer=checkpointer_from_settings(settings, worm, self.clickhouse.client))
        if processors is None:
            # alert actions read recent anomalous requests back from ClickHouse for case bundles; a
            # missing folder or invalid runbook raises RunbookError here (naming the setting), at start
            self.processors.append(ActionRunner.from_settings(settings, query=client_query(self.clickhouse.client)))
        self.published: Counter[str] = Counter()
        self.dead_letter_reasons: Counter[str] = Counter()
        self._routes: dict[type, list[Processor]] = defaultdict(list)
        for processor in self.processors:
            for record_type in processor.inputs:
                self._routes[record_type].append(processor)
        self._watermark = 0.0
        self._max_event_time = 0.0  # unbounded: the end of a finite stream closes every window
        self.events_ahead = 0  # records ahead of this process's clock (they move the watermark only to it)
        # After a crash: the batches journaled but not committed; their replays are checked
        # (``ClickHouseSink.repair_replay``: chDB may have logged a token and lost its part).
        saved_and_cut = {(t.name, p): (self.offsets.get(t.name, p), self.cuts.last_end(t.name, p))
                         for t in TOPICS for p in range(settings.partitions)}
        self._in_doubt = {source: (saved, cut) for source, (saved, cut) in saved_and_cut.items() if cut > saved}

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
            progressed = self._drain_step(on_batch)
            if not progressed:
                break
            total += progressed
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

    def _drain_step(self, on_batch: Callable[[str, int], None] | None) -> int:
        """One pass over every topic partition up to its current end; the number of messages read.

        The order is what makes a SIGKILL anywhere recoverable by a replay: (1) flush the log, so
        every record stored below is on disk and a replay reads it again; (2) plan the batches and
        journal their cuts before storing any, so a replay cuts (and dedup-tokens) them alike;
        (3) store and process them; (4) flush the derived records; (5) only then save the offsets.
        Records derived in this step are read by the next one. One flush and fsync per step, not
        per record or batch.
        """
        self.log.flush()
        plan = [
            (topic.name, partition, start, stop)
            for topic in TOPICS
            for partition in range(self.settings.partitions)
            for start, stop in self.cuts.plan(
                topic.name, partition, self.offsets.get(topic.name, partition), self.log.end_offset(topic.name, partition)
            )
        ]
        if not plan:
            return 0
        self.cuts.save()
        read = 0
        for topic, partition, start, stop in plan:
            self._process_batch(topic, partition, start, self.log.read(topic, partition, start, stop))
            self._crash.reached("batch")
            self.offsets.commit(topic, partition, stop)  # in memory; saved once its outputs are durable
            read += stop - start
            if on_batch:
                on_batch(topic, stop - start)
        for out in self._fire_watermark():
            self.publish(out)
        self.log.flush()
        self._crash.reached("flushed")
        self.offsets.save()
        self._crash.reached("committed")
        return read

    def _process_batch(self, topic: str, partition: int, first: int, frames: list[tuple[str, bytes]]) -> None:
        records: list[Event] = []
        ceiling = event_time_ceiling(time.time())  # see entroloop.streams.windowing.MAX_AHEAD_OF_CLOCK_S
        offsets: list[int] = []
        for i, (key, value) in enumerate(frames):
            try:
                record = decode(value, self.settings.max_record_bytes, self._time_window)
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
            if record.emitted_at > ceiling:  # a producer's clock is ahead: it closes no window early
                self.events_ahead += 1
            self._watermark = max(self._watermark, min(record.emitted_at, ceiling))
            self._max_event_time = max(self._max_event_time, record.emitted_at)
        last = first + len(frames) - 1
        if records:
            refused = self._insert(topic, partition, first, last, frames, offsets, records)
            if refused:  # dead letters now: neither the audit log nor the processors get them
                offsets = [o for i, o in enumerate(offsets) if i not in refused]
                records = [r for i, r in enumerate(records) if i not in refused]
            self._crash.reached("insert")
            if topic in self.audit.topics:
                self._write_audit_log(topic, partition, first, last, offsets, records)
        by_type: dict[type, list[Event]] = defaultdict(list)
        for record in records:
            by_type[type(record)].append(record)
        for record_type, group in by_type.items():
            for processor in self._routes.get(record_type, ()):
                for out in processor.process_batch(group):
                    self.publish(out)

    def _insert(self, topic: str, partition: int, first: int, last: int, frames: list[tuple[str, bytes]],
                offsets: list[int], records: list[Event]) -> set[int]:
        """Insert a batch into ClickHouse; records it refuses become dead letters (their indexes are returned).

        One record ClickHouse cannot store used to fail the insert on every rerun and stop the
        pipeline; the sink bisects the batch, stores the rest and reports each refused record here.
        """
        refused: set[int] = set()

        def dead_letter(index: int, record: Event, reason: str) -> None:
            refused.add(index)
            offset = offsets[index]
            err = CodecError(f"ClickHouse refused the record: {reason}")
            err.error_type = "insert_rejected"
            key, value = frames[offset - first]
            self.publish(self._dead_letter(topic, partition, offset, key, value, err))

        self.clickhouse.write(topic, partition, first, last, records, on_poison=dead_letter)
        saved, last_cut = self._in_doubt.get((topic, partition), (0, 0))
        if saved <= first and last < last_cut:
            self.clickhouse.repair_replay(topic, [(partition, first, last)],
                                          [r for i, r in enumerate(records) if i not in refused])
        return refused

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
        letter = dead_letter_at(topic, partition, offset, key=key, payload=value, error=err, node_id=RUNNER_NODE)
        return self.quarantine.keep(letter, value)  # the whole payload, not just the carried start

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

    def rollup_totals(self) -> dict[str, int]:
        """Records counted by each per-minute rollup (migration 0002), to compare before and after a replay.

        Raw tables show a record stored twice only without ``FINAL``; a sum-rollup keeps it
        forever, so a replay must leave these totals exactly as they were.
        """
        db, query = self.clickhouse.database, self.clickhouse.client.query
        return {f"{table}.{column}": int(query(f"SELECT sum({column}) FROM {db}.{table}").result_rows[0][0] or 0)
                for table, column in ROLLUP_COUNTS.items()}

    def close(self) -> None:
        self.audit.close()  # signs what was sealed since the last checkpoint
        self.log.close()
        self.offsets.save()
