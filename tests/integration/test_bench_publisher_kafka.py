"""`entroloop bench publisher` against the real broker: the node publisher and the bare Producer
baseline both deliver every record, after an untimed warm-up, in repeated rounds, and the figures
carry runs and spreads. (No speed is asserted here: the figures are the benchmark's, written to
BENCHMARKS.md.)"""

from __future__ import annotations

import time

import pytest
from confluent_kafka import Consumer, TopicPartition

from entroloop.benchmarks import publisher as bench
from entroloop.contract.topics import TOPICS

pytestmark = pytest.mark.kafka


def count_messages(bootstrap: str, topics: list[str]) -> int:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"count-{time.time_ns()}"})
    try:
        total = 0
        for topic in topics:
            partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
            for p in partitions:
                low, high = consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                total += high - low
        return total
    finally:
        consumer.close()


def test_publisher_bench_runs_both_sides_in_every_round(kafka_bootstrap: str) -> None:
    prefix = f"benchtest{time.time_ns()}."
    result = bench.run(kafka_bootstrap, events=3000, topic_prefix=prefix, runs=2, warm_up=500)
    assert result["delivered_all"] is True
    assert result["stats"]["sent"] == 2 * 3000 and result["stats"]["failed"] == 0
    rounds = result["rounds"]
    assert len(rounds["delivered_ratio"]["values"]) == 2
    for ratio, mine, bare in zip(rounds["delivered_ratio"]["values"], rounds["delivered_per_s"]["values"],
                                 rounds["bare_delivered_per_s"]["values"], strict=True):
        assert bare > 0 and mine > 0 and ratio == pytest.approx(mine / bare)
    # both sides landed every record: the untimed warm-up (500 through each side, not in the
    # counters), then 2 rounds x (publisher + bare Producer) x 3000
    topics = [prefix + topic.name for topic in TOPICS]
    assert count_messages(kafka_bootstrap, topics) == 2 * 500 + 2 * 2 * 3000
    figures = {f.name: f for f in bench.figures(result)}
    assert figures["delivered: node publisher / bare Producer"].runs == 2
    assert figures["delivered: node publisher / bare Producer"].spread
    assert figures["bare confluent-kafka Producer, delivered"].value == pytest.approx(result["bare_delivered_per_s"])
