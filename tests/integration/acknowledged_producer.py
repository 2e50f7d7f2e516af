"""A Kafka producer for tests that set up their input: every record is acknowledged, or the test says so.

Why: ``Producer.flush() == 0`` only says librdkafka's queue is empty, not that the broker took every
record. A record whose delivery failed (for example ``_UNKNOWN_TOPIC`` just after the test created
its topics, before librdkafka's metadata held them: librdkafka #4904) is gone without a word, and
the test then blames the component under test for losing it. A CI run of
``test_kafka_sinks.py::test_sigterm_flushes_commits_and_exits_zero`` "lost" 4 of 31 feedback
records, all of one topic, with every other topic complete. Here a record whose delivery failed is
produced again, and ``flush`` counts what is still unacknowledged when its time is up.
"""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Producer


class AcknowledgedProducer:
    """``confluent_kafka.Producer``'s ``produce``/``poll``/``flush``, with failed deliveries retried."""

    def __init__(self, config: dict[str, Any]) -> None:
        self._producer = Producer(config)
        self._failed: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self.retried = 0
        self.last_error: KafkaError | None = None

    def produce(self, *args: Any, on_delivery: Any = None, **kwargs: Any) -> None:
        def delivered(err: KafkaError | None, msg: Any) -> None:
            if err is None:
                if on_delivery is not None:
                    on_delivery(err, msg)
                return
            self.last_error = err
            self._failed.append((args, {**kwargs, "on_delivery": on_delivery}))

        try:
            self._producer.produce(*args, on_delivery=delivered, **kwargs)
        except KafkaException as exc:
            # After one such failure librdkafka refuses the topic in produce() itself for a while.
            if exc.args[0].code() != KafkaError._UNKNOWN_TOPIC:
                raise
            self.last_error = exc.args[0]
            self._failed.append((args, {**kwargs, "on_delivery": on_delivery}))

    def poll(self, timeout: float = 0) -> int:
        return self._producer.poll(timeout)

    def flush(self, timeout: float = 30.0) -> int:
        """Wait until every record is acknowledged, producing failed ones again; the number still
        unacknowledged (queued or failed) when ``timeout`` has passed."""
        deadline = time.monotonic() + timeout
        while True:
            queued = self._producer.flush(max(0.0, deadline - time.monotonic()))
            if not self._failed or time.monotonic() >= deadline:
                if self._failed:
                    print(f"AcknowledgedProducer: {len(self._failed)} record(s) not delivered: {self.last_error}")
                return queued + len(self._failed)
            failed, self._failed = self._failed, []
            self.retried += len(failed)
            print(f"AcknowledgedProducer: producing {len(failed)} record(s) again after {self.last_error}")
            time.sleep(0.2)  # give librdkafka's metadata a moment to catch up with the broker
            for args, kwargs in failed:
                self.produce(*args, **kwargs)

    def __len__(self) -> int:
        return len(self._producer)
