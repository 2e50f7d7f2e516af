"""A Faust worker running the bad-case join, as its own process so the test can SIGKILL it.

    python -m tests.integration.bad_case_worker_main BOOTSTRAP PREFIX PARTITIONS STATE TTL_S

STATE is ``table`` (the join state in the changelogged Faust table, as in production) or ``dict``
(the control: a plain in-process dict, lost with the process).
"""

from __future__ import annotations

import sys

from entroloop.streams.app import StreamsApp, StreamsConfig
from entroloop.streams.bad_cases import BadCaseJoiner


class InMemoryBadCaseJoiner(BadCaseJoiner):
    """The control: the same join without a table, so its state dies with the worker."""

    table_state = None  # type: ignore[assignment]


def main() -> None:
    bootstrap, prefix, partitions, state, ttl_s = sys.argv[1:6]
    joiner_class = {"table": BadCaseJoiner, "dict": InMemoryBadCaseJoiner}[state]
    config = StreamsConfig(
        bootstrap=bootstrap,
        topic_prefix=prefix,
        partitions=int(partitions),
        commit_interval_s=0.3,
        health_interval_s=5.0,
        # A SIGKILLed member holds its partitions until its session times out: keep that short so
        # the restarted worker gets them within seconds (broker minimum: 6 s).
        faust_options={"broker_session_timeout": 6.0, "broker_heartbeat_interval": 1.0},
    )
    StreamsApp(config, [joiner_class(ttl_s=float(ttl_s))]).run(loglevel="info")


if __name__ == "__main__":
    main()
