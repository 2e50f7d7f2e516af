"""A Faust worker for the stream tests, run as its own process so tests can SIGKILL it.

    python -m tests.integration.streams_worker_main BOOTSTRAP PREFIX SLOW_REQUEST_ID SLOW_SECONDS CONCURRENCY

Runs ``SeenRecorder``: for every Feedback record it emits one Alert (rule "seen"), after sleeping
SLOW_SECONDS on the record whose request_id is SLOW_REQUEST_ID (an event kept in flight).
"""

from __future__ import annotations

import sys
import time

from entroloop.streams.app import StreamsApp, StreamsConfig
from entroloop.streams.base import Processor, derive

from entroloop.contract.records import Alert, Event, Feedback


class SeenRecorder(Processor):
    """Tiny example processor: one Alert per Feedback, optionally slow on one request."""

    name = "seen_recorder"
    inputs = (Feedback,)
    blocking = True  # it sleeps on the slow request: on a thread, so the other actor and the commits go on

    def __init__(self, slow_request_id: str, slow_seconds: float) -> None:
        self.slow_request_id = slow_request_id
        self.slow_seconds = slow_seconds

    def process(self, record: Event) -> list[Event]:
        if record.request_id == self.slow_request_id:
            time.sleep(self.slow_seconds)
        return [derive(record, Alert, 0, self.name, alert_key=f"seen:{record.event_id}", rule="seen")]


def main() -> None:
    bootstrap, prefix, slow_id, slow_s, concurrency = sys.argv[1:6]
    config = StreamsConfig(
        bootstrap=bootstrap,
        topic_prefix=prefix,
        partitions=1,
        batch_size=1,  # per-event acks, as in the issue-606 reproduction
        commit_interval_s=0.3,
        health_interval_s=1.0,
        concurrency=int(concurrency),
        allow_unsafe_concurrency=int(concurrency) > 1,
        # A SIGKILLed member holds its partitions until its session times out: keep that short so
        # the restarted worker gets the partition within seconds (broker minimum: 6 s).
        faust_options={"broker_session_timeout": 6.0, "broker_heartbeat_interval": 1.0},
    )
    StreamsApp(config, [SeenRecorder(slow_id, float(slow_s))]).run(loglevel="info")


if __name__ == "__main__":
    main()
