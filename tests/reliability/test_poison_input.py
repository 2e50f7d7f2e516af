"""Poison input between valid traffic: each poison record lands in dead letters with its reason, and
every valid record before and after it is stored exactly once (the stream keeps flowing).

Poison kinds: truncated bytes, a future schema version, a record above the size limit, invalid
UTF-8 in a string field, NaN and Inf in a packed entropy array. A request id that never completes
(a first chunk whose final chunk never comes) is not poison: its record is valid and stored; the
processor waiting for the rest turns it into a dead letter (`incomplete_request`) after its TTL.
"""

from __future__ import annotations

import struct
import time
from pathlib import Path

import msgspec
import pytest
from entroloop.streams.entropy_anomaly import EntropyAnomalyDetector

from entroloop.contract import codec
from entroloop.contract.records import TokenEntropy, pack_entropies
from entroloop.contract.topics import partition_for
from entroloop.infra.kafka_topics import ensure_topics
from tests.integration.acknowledged_producer import AcknowledgedProducer
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
    fields = msgspec.to_builtins(valid, builtin_types=(bytes,))  # packed arrays stay bytes, as on the wire
    fields["kind"] = "token_entropy"
    good = codec.encode(valid)
    # same length as the model name, so the msgpack str header stays right but the bytes are not UTF-8
    marker = valid.model.encode()
    bad_utf8 = good.replace(marker, b"\xff\xfe" + marker[2:], 1)
    assert bad_utf8 != good
    # (token_hashes, one per entropy, go too: each poison has exactly the one fault it is named for)
    oversized = msgspec.structs.replace(valid, entropies=pack_entropies([1.0] * (SIZE_LIMIT // 2 + 10)),
                                        token_hashes=b"")
    wire = msgspec.msgpack.decode(good)  # the wire map with its bytes intact

    def decodable_but_wrong(**changes: object) -> bytes:
        return msgspec.msgpack.encode({**wire, **changes})

    return {
        "truncated bytes": (good[: len(good) // 2], "malformed", ""),
        "wrong schema version": (msgspec.msgpack.encode({**fields, "schema_version": 99}),
                                 "unsupported_schema_version", "schema_version 99"),
        "oversized record": (codec.encode(oversized), "too_large", "exceeds the limit"),
        "invalid UTF-8": (bad_utf8, "malformed", "utf-8"),
        "NaN in entropies": (msgspec.msgpack.encode({**fields, "entropies": pack_entropies([2.0, float("nan"), 3.0]),
                                                     "token_hashes": b""}),
                             "malformed", "NaN or Inf"),
        "Inf in entropies": (msgspec.msgpack.encode({**fields, "entropies": pack_entropies([2.0, float("inf")]),
                                                     "token_hashes": b""}),
                             "malformed", "NaN or Inf"),
        # decodable but wrong (issue 12): each used to reach the ClickHouse insert and fail it
        "event id that is no UUID": (decodable_but_wrong(event_id="not-a-uuid"), "malformed", "$.event_id"),
        "seq=-1": (decodable_but_wrong(seq=-1), "malformed", "$.seq"),
        "chunk_index=-5": (decodable_but_wrong(chunk_index=-5), "malformed", "$.chunk_index"),
        "emitted_at NaN": (decodable_but_wrong(emitted_at=float("nan")), "malformed", "$.emitted_at"),
        "emitted_at 1e12": (decodable_but_wrong(emitted_at=1e12), "malformed", "$.emitted_at"),
        "emitted_at 100 days old": (decodable_but_wrong(emitted_at=time.time() - 100 * 86_400),
                                    "out_of_time_window", "days old"),
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
    producer = AcknowledgedProducer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True,
                                     "linger.ms": 5, "message.max.bytes": 2 << 20})
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
        f"poison input ({len(poisons)} kinds) between valid traffic",
        sent=len(sent) + len(poisons),
        stored={"clickhouse": unique, "dead_letters": len(dead)},
        lost=lost,
        recovery_s=drained_s,
        note="recovery_s = sink start to drained; " + ", ".join(f"{n}: {found[n][0]}" for n in poisons)
        + "; unfinished request stored, then a dead letter (incomplete_request) after the TTL",
    ))
    assert lost == 0 and twice == 0


# --- the embedded pipeline: one decodable-but-wrong record never stops it (issue 12, finding 4) ------
DAY_S = 86_400.0


def _good_audits(n: int, stamper) -> list:
    from entroloop.contract.records import Audit

    return [Audit(**stamper.stamp(), request_id=f"req-{i}", audit_id=f"audit-{i}", model="m", prompt=f"question {i}",
                  response=f"answer {i}") for i in range(n)]


def _embedded(tmp_path: Path, chdb_dsn: str, database: str):
    from entroloop.contract.settings import Settings
    from entroloop.runner import EmbeddedRunner

    settings = Settings(data_dir=tmp_path / "data", clickhouse_dsn=chdb_dsn, clickhouse_database=database,
                        audit_store="local", partitions=3, audit_batch_records=100)
    return EmbeddedRunner(settings, processors=[])


def _wire(record, **changes) -> bytes:
    fields = msgspec.msgpack.decode(codec.encode(record))
    fields.update(changes)
    return msgspec.msgpack.encode(fields)


EMBEDDED_POISON = {
    "event id that is no UUID": ({"event_id": "not-a-uuid"}, "malformed", "$.event_id"),
    "seq=-1": ({"seq": -1}, "malformed", "$.seq"),
    "emitted_at NaN": ({"emitted_at": float("nan")}, "malformed", "$.emitted_at"),
    "emitted_at Inf": ({"emitted_at": float("inf")}, "malformed", "$.emitted_at"),
    "emitted_at 0 (1970)": ({"emitted_at": 0.0}, "malformed", "$.emitted_at"),
    "emitted_at 1e12": ({"emitted_at": 1e12}, "malformed", "$.emitted_at"),
    "emitted_at 100 days old": ({"emitted_at": time.time() - 100 * DAY_S}, "out_of_time_window", "days old"),
    "prompt_tokens=-5 (a span)": ({"prompt_tokens": -5}, "malformed", "$.prompt_tokens"),
    "rating=1000 (a feedback)": ({"rating": 1000}, "malformed", "$.rating"),
}


def _poison_record(name: str, stamper):
    from entroloop.contract.records import Feedback, Span

    if "(a span)" in name:
        at = time.time()
        return Span(**stamper.stamp(), request_id="req-poison", span_id="s", name="llm_request", start_time=at - 1,
                    end_time=at)
    if "(a feedback)" in name:
        return Feedback(**stamper.stamp(), request_id="req-poison", rating=-1)
    return _good_audits(1, stamper)[0]


def _dead_letters(runner) -> list[tuple]:
    db = runner.settings.clickhouse_database
    return runner.clickhouse.client.query(
        f"SELECT source_topic, error_type, reason FROM {db}.dead_letters FINAL").result_rows


def _audit_log_records(runner) -> int:
    from entroloop.sinks.audit.verify import verify_store

    from entroloop.contract.records import Audit

    report = verify_store(runner.audit.store)
    return report.records_by_topic.get(Audit.topic, 0)


@pytest.mark.parametrize("name", list(EMBEDDED_POISON))
def test_embedded_300_audits_and_one_poison_all_stored_the_poison_dead_lettered(tmp_path, chdb_dsn, ch_database, name):
    from entroloop.contract.ids import NodeStamper

    stamper = NodeStamper("node-embedded")
    changes, error_type, phrase = EMBEDDED_POISON[name]
    good = _good_audits(300, stamper)
    poison = _poison_record(name, stamper)
    runner = _embedded(tmp_path, chdb_dsn, ch_database)
    for record in good[:150]:
        runner.publish(record)
    runner.publish_raw(poison.topic, poison.request_id, _wire(poison, **changes))
    for record in good[150:]:
        runner.publish(record)
    runner.drain()

    assert runner.clickhouse.count("audit_index") == 300
    assert _audit_log_records(runner) == 300
    dead = _dead_letters(runner)
    assert [(t, e) for t, e, _ in dead] == [(poison.topic, error_type)], dead
    assert phrase in dead[0][2], dead[0][2]
    runner.close()


def test_embedded_a_frame_key_that_is_not_utf8_does_not_stop_the_log(tmp_path, chdb_dsn, ch_database):
    from entroloop.contract.ids import NodeStamper
    from entroloop.contract.records import Audit

    good = _good_audits(301, NodeStamper("node-key"))
    runner = _embedded(tmp_path, chdb_dsn, ch_database)
    for record in good[:300]:
        runner.publish(record)
    runner.close()
    # a foreign writer appends a frame whose key is not UTF-8 (layout: u32 key, id, value lengths)
    key, event_id, value = b"\xff\xfe-req", good[300].event_id.encode(), codec.encode(good[300])
    frame = struct.pack("<III", len(key), len(event_id), len(value)) + key + event_id + value
    with open(next((tmp_path / "data" / "log" / Audit.topic).glob("*.log")), "ab") as fh:
        fh.write(frame)

    runner = _embedded(tmp_path, chdb_dsn, ch_database)  # used to fail here: UnicodeDecodeError
    runner.drain()
    assert runner.clickhouse.count("audit_index") == 301
    assert _audit_log_records(runner) == 301
    runner.close()


def test_embedded_a_record_clickhouse_refuses_is_bisected_out_and_dead_lettered(tmp_path, chdb_dsn, ch_database):
    """A record the contract accepts but the table refuses (here: a CHECK constraint) is found by
    bisecting the insert; the rest of its batch is stored, and a replay stores nothing twice."""
    from entroloop.contract.ids import NodeStamper

    runner = _embedded(tmp_path, chdb_dsn, ch_database)
    runner.clickhouse.client.command(
        f"ALTER TABLE {ch_database}.audit_index ADD CONSTRAINT no_blocked CHECK request_id != 'blocked'")
    good = _good_audits(300, NodeStamper("node-refused"))
    blocked = msgspec.structs.replace(_good_audits(1, NodeStamper("node-blocked"))[0], request_id="blocked")
    for record in good[:200] + [blocked] + good[200:]:
        runner.publish(record)
    runner.drain()

    assert runner.clickhouse.count("audit_index") == 300
    assert _audit_log_records(runner) == 300
    dead = _dead_letters(runner)
    assert [(t, e) for t, e, _ in dead] == [(blocked.topic, "insert_rejected")], dead
    assert "no_blocked" in dead[0][2] and "ClickHouse refused" in dead[0][2], dead[0][2]

    runner.rewind()  # a replay: same batches, same tokens; the bisected halves are not inserted again
    runner.clickhouse = type(runner.clickhouse)(runner.clickhouse.client, ch_database, apply_migrations=False)
    runner.drain()
    raw = runner.clickhouse.client.query(f"SELECT count() FROM {ch_database}.audit_index").result_rows[0][0]
    assert raw == 300, "a replay inserted good halves again"
    assert len(_dead_letters(runner)) == 1
    runner.close()
