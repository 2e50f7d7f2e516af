"""Poison input between valid traffic: each poison record lands in dead letters with its reason, and
every valid record before and after it is stored exactly once (the stream keeps flowing).

Poison kinds: truncated bytes, a future schema version, a record above the size limit, invalid
UTF-8 in a string field, NaN and Inf in a packed entropy array. A request id that never completes
(a first chunk whose final chunk never comes) is not poison: its record is valid and stored; the
processor waiting for the rest turns it into a dead letter (`incomplete_request`) after its TTL.
"""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
from confluent_kafka import Producer

from entroloop.contract import codec
from entroloop.contract.records import TokenEntropy, pack_entropies
from entroloop.contract.topics import partition_for
from entroloop.infra.kafka_topics import ensure_topics
from streams.entropy_anomaly import EntropyAnomalyDetector
from tests.reliability.harness import (
    Figures,
    all_identities,
    check_exactly_once,
    clickhouse_identities,
    clickhouse_query,
    fleet_records,
    identity,
    report,
    run_sink,
    sink_env,
)

PARTITIONS = 3
SIZE_LIMIT = 64 * 1024  # the sink's ENTROLOOP_MAX_RECORD_BYTES in this test


def poison_payloads(valid: TokenEntropy) -> dict[str, tuple[bytes, str, str]]:
    """name -> (payload, expected error_type, a phrase the reason must contain)."""
    fields = msgspec.to_builtins(valid)
    fields["kind"] = "token_entropy"
    good = codec.encode(valid)
    # same length as the model name, so the msgpack str header stays right but the bytes are not UTF-8
    marker = valid.model.encode()
    bad_utf8 = good.replace(marker, b"\xff\xfe" + marker[2:], 1)
    assert bad_utf8 != good
    oversized = msgspec.structs.replace(valid, entropies=pack_entropies([1.0] * (SIZE_LIMIT // 2 + 10)))
    return {
        "truncated bytes": (good[: len(good) // 2], "malformed", ""),
        "wrong schema version": (msgspec.msgpack.encode({**fields, "schema_version": 99}),
                                 "unsupported_schema_version", "schema_version 99"),
        "oversized record": (codec.encode(oversized), "too_large", "exceeds the limit"),
        "invalid UTF-8": (bad_utf8, "malformed", "utf-8"),
        "NaN in entropies": (msgspec.msgpack.encode({**fields, "entropies": pack_entropies([2.0, float("nan"), 3.0])}),
                             "malformed", "NaN or Inf"),
        "Inf in entropies": (msgspec.msgpack.encode({**fields, "entropies": pack_entropies([2.0, float("inf")])}),
                             "malformed", "NaN or Inf"),
    }


def test_poison_input_goes_to_dead_letters_and_the_stream_keeps_flowing(
    kafka_bootstrap: str, topic_prefix: str, tmp_path: Path
) -> None:
    ensure_topics(kafka_bootstrap, topic_prefix, PARTITIONS)
    records = fleet_records(300, seed=51)  # one fleet: (node_id, seq) are unique within it
    before, after = records[: len(records) // 2], records[len(records) // 2 :]
    valid_token = next(r for r in before if isinstance(r, TokenEntropy))
    # A request that never completes: its first chunk, and no final chunk ever.
    unfinished = msgspec.structs.replace(valid_token, request_id="req-never-completes", final=False, seq=10**9,
                                         node_id="node-unfinished", event_id="0" * 8 + valid_token.event_id[8:])
    poisons = poison_payloads(valid_token)
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True, "linger.ms": 5,
                         "message.max.bytes": 2 << 20})
    poison_at: dict[tuple[int, int], str] = {}

    def remember(name: str):
        def delivered(err, msg) -> None:
            assert err is None, err
            poison_at[(msg.partition(), msg.offset())] = name
        return delivered

    def produce(records) -> None:
        for r in records:
            producer.produce(topic_prefix + r.topic, key=r.request_id.encode(), value=codec.encode(r),
                             partition=partition_for(r.request_id, PARTITIONS))

    produce(before)
    for i, (name, (payload, _, _)) in enumerate(poisons.items()):
        producer.produce(topic_prefix + TokenEntropy.topic, key=f"poison-{i}".encode(), value=payload,
                         partition=i % PARTITIONS, on_delivery=remember(name))
    produce([unfinished])
    produce(after)
    assert producer.flush(60) == 0

    started = time.monotonic()
    env = sink_env(kafka_bootstrap, topic_prefix, tmp_path, PARTITIONS, ENTROLOOP_MAX_RECORD_BYTES=str(SIZE_LIMIT))
    code, stats, err = run_sink("clickhouse", env)
    drained_s = time.monotonic() - started
    assert code == 0, err[-3000:]
    assert stats["dead_letters"] == len(poisons), stats

    dead = clickhouse_query(tmp_path, "SELECT source_partition, source_offset, error_type, reason FROM "
                                      "entroloop.dead_letters ORDER BY source_partition, source_offset")["query"]
    found = {poison_at[(int(p), int(o))]: (error_type, reason) for p, o, error_type, reason in dead}
    assert len(dead) == len(poisons), dead
    for name, (_, error_type, phrase) in poisons.items():
        assert name in found, f"{name}: no dead letter"
        assert found[name][0] == error_type, f"{name}: {found[name]}"
        assert phrase.lower() in found[name][1].lower(), f"{name}: reason {found[name][1]!r}"

    per_table = clickhouse_identities(tmp_path)
    stored = all_identities(per_table, [t for t in per_table if t != "dead_letters"])
    sent = [identity(r) for r in before + [unfinished] + after]
    unique, twice, lost = check_exactly_once(sent, stored, "clickhouse")

    # The unfinished request: once event time passes the TTL, the processor waiting for its final
    # chunk reports it as a dead letter with the reason (checked in-process: no worker runs here).
    detector = EntropyAnomalyDetector(incomplete_ttl_s=600)
    detector.process(unfinished)
    assert detector.on_watermark(unfinished.emitted_at + 599) == []
    letters = detector.on_watermark(unfinished.emitted_at + 601)
    assert [(d.request_id, d.error_type) for d in letters] == [("req-never-completes", "incomplete_request")]
    assert "never completed" in letters[0].reason

    report(Figures(
        "poison input (6 kinds) between valid traffic",
        sent=len(sent) + len(poisons),
        stored={"clickhouse": unique, "dead_letters": len(dead)},
        lost=lost,
        recovery_s=drained_s,
        note="recovery_s = sink start to drained; " + ", ".join(f"{n}: {found[n][0]}" for n in poisons)
        + "; unfinished request stored, then a dead letter (incomplete_request) after the TTL",
    ))
    assert lost == 0 and twice == 0
