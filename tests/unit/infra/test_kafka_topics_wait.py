"""`wait_until_served` asks again for partitions the broker does not serve yet, and names them when
its time is up (the logic; tests/integration/test_kafka_topics_served.py runs it on a broker)."""

from __future__ import annotations

from concurrent.futures import Future

import pytest
from confluent_kafka import KafkaError, KafkaException

from entroloop.infra.kafka_topics import wait_until_served


class SlowBroker:
    """An AdminClient stand-in whose partition p is served from the (p+1)-th ListOffsets round on;
    ``never`` are never served."""

    def __init__(self, never: set[int] = frozenset()) -> None:
        self.rounds = 0
        self.never = never
        self.metadata_refreshes = 0

    def list_topics(self, timeout: float) -> None:
        self.metadata_refreshes += 1

    def list_offsets(self, requests: dict, request_timeout: float) -> dict:
        self.rounds += 1
        answers = {}
        for tp in requests:
            future: Future = Future()
            if tp.partition < self.rounds and tp.partition not in self.never:
                future.set_result(0)
            else:
                future.set_exception(KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION)))
            answers[tp] = future
        return answers


def test_it_returns_once_every_partition_is_served_refreshing_metadata_each_round() -> None:
    broker = SlowBroker()
    wait_until_served(broker, {"t.a": 3, "t.b": 2}, timeout=10)
    assert broker.rounds == 3 == broker.metadata_refreshes


def test_partitions_never_served_are_named_when_time_is_up() -> None:
    with pytest.raises(TimeoutError, match=r"does not serve 2 partition\(s\).*t\.a\[2\], t\.b\[2\]"):
        wait_until_served(SlowBroker(never={2}), {"t.a": 3, "t.b": 3}, timeout=0.5)
