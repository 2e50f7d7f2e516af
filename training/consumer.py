"""The trainer as a Kafka consumer: retrain requests -> one claimed job per trigger key -> run.

Per message of the retrain topic (consumer group ``<prefix>entroloop-trainer``, manual commits):

1. Decode with ``entroloop.contract.codec``. Bytes that are not a ``RetrainRequest`` (bad bytes, an unknown
   schema, a record of another kind) become a ``DeadLetter`` with the reason, published through the
   node publisher to the dead-letter topic; nothing is raised into the loop.
2. ``JobRunner.claim``: the job folder for the trigger key is created atomically and fsync'ed; a key
   that already has a job is a no-op (and a ``retrain.duplicate`` action).
3. Commit ``offset + 1``, synchronously, only now: a crash before the commit re-reads the request and
   the claim turns it into a duplicate; a crash after it leaves a claimed job that the next start
   resumes. Either way one job per key, none lost.
4. Hand the job to the worker thread, which runs jobs one at a time.

Why a worker thread: a job trains for minutes or hours, and Kafka expels a member that does not poll
within ``max.poll.interval.ms``. The main thread keeps polling (and claiming, which is cheap and
durable) while the worker trains; the job folders, not the consumer's memory, are the queue's truth.

On start, jobs that a dead process left unfinished (``JobStore.resumable``: lock free, state not
terminal) are queued first, so a trainer killed mid-training resumes from its checkpoint.

Dead letters and action records go through the node publisher (``entroloop.collectors.publisher``): it never
blocks, spools to disk while the broker is away, and is flushed before an offset past a dead letter
is committed.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import asdict, dataclass, field
from typing import Any

from entroloop.training.jobs import Job, JobBusy, JobRunner

from entroloop.contract.codec import CodecError, dead_letter_at, decode
from entroloop.contract.records import Event, RetrainRequest
from entroloop.infra.kafka_consumer_config import manual_commit_consumer_config
from entroloop.infra.metrics import DEAD_LETTERS, EVENTS_IN, mark_commit
from entroloop.infra.partition_drain import DrainWatch

log = logging.getLogger("entroloop.training.consumer")

RETRAIN_TOPIC = RetrainRequest.topic


@dataclass
class TrainerStats:
    messages: int = 0
    claimed: int = 0
    duplicates: int = 0
    dead_letters: int = 0
    commits: int = 0
    commit_failures: int = 0
    resumed: int = 0
    jobs_run: int = 0
    jobs_failed: int = 0
    jobs_busy: int = 0
    final_states: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class JobWorker:
    """Runs claimed jobs one at a time in a daemon thread (a job's lock keeps other processes out)."""

    def __init__(self, runner: JobRunner, stats: TrainerStats) -> None:
        self.runner = runner
        self.stats = stats
        self._jobs: queue.Queue[Job] = queue.Queue()
        self._busy = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="entroloop-trainer-jobs", daemon=True)
        self._thread.start()

    def put(self, job: Job) -> None:
        self._busy.set()  # before the queue sees it, so ``idle`` never reads a gap as idle
        self._jobs.put(job)

    @property
    def idle(self) -> bool:
        return self._jobs.empty() and not self._busy.is_set()

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            self._busy.set()
            try:
                status = self.runner.run(job)
                self.stats.jobs_run += 1
                state = str(status.get("state"))
                self.stats.final_states[state] = self.stats.final_states.get(state, 0) + 1
                log.info("job %s: %s", status.get("trigger_key"), state)
            except JobBusy:
                self.stats.jobs_busy += 1  # another trainer process runs it
            except Exception:
                self.stats.jobs_failed += 1
                log.exception("job %s failed", job.folder.name)
            finally:
                if self._jobs.empty():
                    self._busy.clear()


class RetrainConsumer:
    """Consumes retrain requests from Kafka into ``runner`` (see the module docstring).

    ``publish`` is the node publisher (or anything with ``publish(record)`` and ``flush(timeout)``);
    the ``runner``'s ``ActionLog`` should emit through the same publisher.
    """

    def __init__(self, settings: Any, runner: JobRunner, publish: Any, *, session_timeout_s: float = 30.0,
                 consumer_config: dict[str, Any] | None = None) -> None:
        from confluent_kafka import Consumer

        self.settings = settings
        self.runner = runner
        self.publisher = publish
        self.topic = settings.topic_prefix + RETRAIN_TOPIC
        self.group_id = f"{settings.topic_prefix}entroloop-trainer"
        self.stats = TrainerStats()
        config = manual_commit_consumer_config(
            settings, group_id=self.group_id, client_id=f"entroloop-trainer-{settings.node_id}",
            logger_name="entroloop.training.consumer.librdkafka", session_timeout_s=session_timeout_s,
        )
        config.update(consumer_config or {})
        self.consumer = Consumer(config)
        self._drain = DrainWatch()
        self._stop = threading.Event()
        self.worker = JobWorker(runner, self.stats)

    def stop(self) -> None:
        self._stop.set()

    # --- the loop ------------------------------------------------------------------------------
    def run(self, until_idle: bool = False, poll_s: float = 0.5) -> TrainerStats:
        """Consume until ``stop()``; with ``until_idle``, return once every assigned partition is
        drained and no job is queued or running."""
        for job in self.runner.store.resumable():
            self.stats.resumed += 1
            self.worker.put(job)
        self.consumer.subscribe([self.topic], on_assign=self._drain.on_assign,
                                on_revoke=self._drain.on_revoke, on_lost=self._drain.on_revoke)
        try:
            while not self._stop.is_set():
                message = self.consumer.poll(poll_s)
                if message is not None:
                    self._handle(message)
                elif until_idle and self._drain.drained and self.worker.idle:
                    break
        finally:
            self.consumer.close()
        return self.stats

    def _handle(self, message: Any) -> None:
        from confluent_kafka import KafkaError

        error = message.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                self._drain.reached_end(message.partition())
            else:
                log.warning("trainer consumer: %s", error)
            return
        self._drain.got_record(message.partition())
        self.stats.messages += 1
        EVENTS_IN.labels("trainer", RETRAIN_TOPIC).inc()
        value = message.value() or b""
        try:
            record = decode(value, self.settings.max_record_bytes)
            if not isinstance(record, RetrainRequest):
                err = CodecError(f"a {type(record).__name__} record on topic {RETRAIN_TOPIC}")
                err.error_type = "wrong_topic"
                raise err
        except CodecError as err:
            self.publisher.publish(self._dead_letter(message, value, err))
            self.stats.dead_letters += 1
            DEAD_LETTERS.labels("trainer", RETRAIN_TOPIC).inc()
            if not self.publisher.flush(30.0):  # still queued or spooled on disk: not lost
                log.warning("trainer consumer: dead letter for offset %d not yet delivered", message.offset())
            self._commit(message)
            return
        job = self.runner.claim(record)
        self._commit(message)  # the claim is durable (renamed and fsync'ed) before the commit
        if job is None:
            self.stats.duplicates += 1
        else:
            self.stats.claimed += 1
            self.worker.put(job)

    def _commit(self, message: Any) -> None:
        from confluent_kafka import KafkaException, TopicPartition

        try:
            self.consumer.commit(offsets=[TopicPartition(message.topic(), message.partition(), message.offset() + 1)],
                                 asynchronous=False)
            self.stats.commits += 1
            mark_commit("trainer")
        except KafkaException as exc:  # a rebalance: the next owner re-reads it, the claim dedups it
            self.stats.commit_failures += 1
            log.warning("trainer consumer: commit of offset %d failed: %s", message.offset() + 1, exc)

    def _dead_letter(self, message: Any, value: bytes, err: CodecError) -> Event:
        """Same id derivation as the sinks' dead letters: a redelivery repeats the id."""
        return dead_letter_at(RETRAIN_TOPIC, message.partition(), message.offset(), key=message.key(),
                              payload=value, error=err, node_id=f"trainer@{self.settings.node_id}")


__all__ = ["RETRAIN_TOPIC", "JobWorker", "RetrainConsumer", "TrainerStats"]
