"""The entropy detector's carry survives a SIGKILLed worker: a loop spanning a chunk boundary is one
alert, and a request whose final chunk never comes is still reported after the TTL.

The real ``entroloop worker`` (every processor, as deployed) processes and commits chunk 0 of three
long requests: two end in a loop that chunk 1 continues (its tail alone is under ``min_run`` for
one, over it for the other), one never sends chunk 1. The worker is SIGKILLed; chunk 1 of the first
two is published with an event time past the incomplete-request TTL (the whole story is set in the
past, ending two minutes ago: event time never runs ahead of the worker's clock); a new worker starts. It has
never seen chunk 0 (its offset was committed), so only the ``entropy_carry`` table recovered from
its changelog can give it the runs' starts and the unfinished request. It must publish exactly what
the detector gives in-process for all the chunks (same event ids, spans, alert keys, dead letter).
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest
from entroloop.streams.entropy_anomaly import GIBBERISH, LOOP, EntropyAnomalyDetector

from entroloop.contract.ids import NodeStamper
from entroloop.contract.records import (
    Alert,
    DeadLetter,
    Event,
    TokenEntropy,
    pack_entropies,
)
from entroloop.contract.settings import Settings
from entroloop.infra.kafka_topics import ensure_topics
from tests.integration.test_bad_case_join_restart import (
    APP_ID,
    committed_total,
    publish,
)
from tests.integration.test_fleet_worker_kafka import start_worker
from tests.integration.test_streams_worker_kafka import TopicReader

pytestmark = pytest.mark.kafka

CHUNK = 4096  # the collector's chunk size (collectors/vllm/ledger.py)
NORMAL, LOOPING = 3.0, 0.3


def chunk(stamper: NodeStamper, request_id: str, index: int, first: int, values: list[float], final: bool,
          emitted_at: float) -> TokenEntropy:
    stamp = {**stamper.stamp(), "emitted_at": emitted_at}
    return TokenEntropy(**stamp, request_id=request_id, model="m", entropies=pack_entropies(values),
                        chunk_index=index, first_token_index=first, final=final)


def entropy_outputs(records: list[Event]) -> tuple[list[tuple], list[tuple]]:
    """(alerts, incomplete-request dead letters) as comparable tuples, sorted; repeats kept."""
    alerts = sorted((a.event_id, a.request_id, a.token_start, a.token_end, a.alert_key) for a in records
                    if isinstance(a, Alert) and a.rule in (LOOP, GIBBERISH))
    letters = sorted((d.event_id, d.request_id, d.reason, d.payload, d.payload_size) for d in records
                     if isinstance(d, DeadLetter) and d.error_type == "incomplete_request")
    return alerts, letters


def test_chunk_carry_is_recovered_by_a_new_worker_after_a_kill(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    settings = Settings(entropy_evidence=False)  # the carry of the static runs (the worker's env says the same)
    min_run, ttl = settings.loop_min_run, settings.incomplete_request_ttl_s
    stamper = NodeStamper("node-carry-test")
    # Event times in the past, as for traffic read after the fact: a worker moves event time at
    # most to its own clock (entroloop.streams.windowing.MAX_AHEAD_OF_CLOCK_S), so chunk 1 cannot
    # make the TTL pass by coming from the future; it comes two minutes before now instead.
    t0 = time.time() - ttl - 121
    head = [NORMAL] * (CHUNK - (min_run - 1)) + [LOOPING] * (min_run - 1)  # a loop too short alone
    # The request that never ends went quiet a minute before the other two. Chunk 1 comes after its
    # TTL (event time), so it expires it, and within the TTL of the other two: the worker may close
    # a watermark after one of them and before the other (they sit on different partitions, so in
    # different batches), and neither may expire then. With all three at t0 this raced: a watermark
    # at t0 + ttl + 1 between the two chunk 1s expired the second's carry.
    tails_at = t0 + 60
    first = [chunk(stamper, rid, 0, 0, head, False, tails_at) for rid in ("short-tail", "long-tail")]
    first.append(chunk(stamper, "never-ends", 0, 0, head, False, t0))
    later = t0 + ttl + 1
    assert later - tails_at < ttl < later - t0
    second = [
        chunk(stamper, "short-tail", 1, CHUNK, [LOOPING] * (min_run - 1) + [NORMAL] * 50, True, later),
        chunk(stamper, "long-tail", 1, CHUNK, [LOOPING] * (min_run + 2) + [NORMAL] * 50, True, later),
    ]

    in_process = EntropyAnomalyDetector.from_settings(settings)
    reference = in_process.process_batch(first) + in_process.process_batch(second)
    reference += in_process.on_watermark(later)
    expected = entropy_outputs(reference)
    start = CHUNK - (min_run - 1)
    assert sorted((rid, s, e) for _, rid, s, e, _ in expected[0]) == sorted(
        [("short-tail", start, CHUNK + min_run - 1), ("long-tail", start, CHUNK + min_run + 2)]
    )
    assert [rid for _, rid, *_ in expected[1]] == ["never-ends"]

    ensure_topics(kafka_bootstrap, topic_prefix, settings.partitions)
    tokens_topic, group = topic_prefix + TokenEntropy.topic, topic_prefix + APP_ID
    alerts = TopicReader(kafka_bootstrap, topic_prefix + Alert.topic)
    letters = TopicReader(kafka_bootstrap, topic_prefix + DeadLetter.topic)
    try:
        publish(kafka_bootstrap, topic_prefix, first)
        worker, log_path = start_worker(kafka_bootstrap, topic_prefix, tmp_path)
        deadline = time.monotonic() + 120
        # Chunk 0 processed and its offsets committed (its carry is in the changelog before that).
        while committed_total(kafka_bootstrap, group, tokens_topic, settings.partitions) < len(first):
            assert worker.poll() is None, f"worker died:\n{log_path.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"chunk 0 not committed:\n{log_path.read_text()[-3000:]}"
            time.sleep(0.5)
        worker.send_signal(signal.SIGKILL)
        worker.wait(timeout=30)

        publish(kafka_bootstrap, topic_prefix, second)
        worker, log_path = start_worker(kafka_bootstrap, topic_prefix, tmp_path)
        try:
            deadline = time.monotonic() + 120
            while committed_total(kafka_bootstrap, group, tokens_topic, settings.partitions) < len(first) + len(second):
                assert worker.poll() is None, f"worker died:\n{log_path.read_text()[-3000:]}"
                assert time.monotonic() < deadline, f"chunk 1 not committed:\n{log_path.read_text()[-3000:]}"
                time.sleep(0.5)
            # The worker runs until the outputs are seen. Stopped as soon as chunk 1 was committed,
            # it had published no dead letter in 3 of 8 runs (with or without the idle timer): the
            # last batch's watermark had not expired the request (its carry can be recovered, or
            # its partition waited for, after that watermark ran) and no later event came. The
            # idle timer's watermark (streams.app.WatermarkCadence) now expires it ~3 s after the
            # traffic stops; before it, only the next request would have.
            alerts.read_until(lambda rs: len(set(entropy_outputs(rs)[0])) >= len(expected[0]), timeout=30)
            letters.read_until(lambda rs: len(set(entropy_outputs(rs)[1])) >= len(expected[1]), timeout=30)
        finally:
            worker.send_signal(signal.SIGTERM)
            worker.wait(timeout=60)
        # A short read more catches any duplicate.
        alerts.read_until(lambda rs: False, timeout=1)
        letters.read_until(lambda rs: False, timeout=1)
    finally:
        alerts.close()
        letters.close()
    got = entropy_outputs(alerts.records + letters.records)
    # At-least-once: a record may be published twice (Faust hands the records it prefetched during a
    # table recovery over again after seeking to the committed offsets), but every copy must be
    # the in-process record, so the sinks' event-id dedup keeps the right one. Expected ids are
    # unique, so equal sets mean every copy of an id is identical.
    assert sorted(set(got[0])) == expected[0], f"alerts: got {got[0]}, expected {expected[0]}\n{log_path.read_text()[-3000:]}"
    assert sorted(set(got[1])) == expected[1], (
        f"dead letters: got {[d[:3] for d in got[1]]}, expected {[d[:3] for d in expected[1]]}"
    )
    print(f"\nentropy carry across a kill: {len(expected[0])} alerts, {len(expected[1])} dead letter; "
          f"published copies: {len(got[0])} alerts, {len(got[1])} dead letters")
