"""The audit gateway publishing through the node publisher to the real Kafka broker.

Configured only by settings (as `entroloop gateway` is): Audit, Span and approximate TokenEntropy
records arrive on their topics, share ids (the client's W3C trace id, the gateway's span a child of
the client's), and no raw PII is in any byte stored in Kafka.
"""

from __future__ import annotations

import time
from pathlib import Path

import msgspec
import pytest
from confluent_kafka import Consumer
from entroloop.collectors.gateway.app import app_from_settings
from starlette.testclient import TestClient

from entroloop.contract import codec
from entroloop.contract.records import Audit, Span, TokenEntropy
from entroloop.contract.settings import load_settings
from entroloop.infra.kafka_topics import ensure_topics
from tests.unit.collectors.fake_openai_upstream import FakeUpstream

pytestmark = pytest.mark.kafka

EMAIL = "carol.jones@example.net"
PHONE = "+44 20 7946 0958"
CARD = "4111 1111 1111 1111"
CLIENT_PARENT = "00f067aa0ba902b7"


def _trace_id(i: int) -> str:
    return f"4bf92f3577b34da6a3ce929d0e0e47{i:02x}"


def _consume_raw(bootstrap: str, topics: list[str], expected: int, timeout: float = 60.0) -> list[bytes]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"gw-check-{time.time_ns()}",
                         "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.subscribe(topics)
    values: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and len(values) < expected:
            values += [m.value() for m in consumer.consume(1000, timeout=0.5) if m.error() is None]
        time.sleep(1.0)  # and read on briefly to catch duplicates
        values += [m.value() for m in consumer.consume(1000, timeout=0.5) if m.error() is None]
    finally:
        consumer.close()
    return values


def test_gateway_records_reach_kafka_redacted(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    ensure_topics(kafka_bootstrap, prefix=topic_prefix)
    settings = load_settings(kafka_bootstrap=kafka_bootstrap, topic_prefix=topic_prefix, node_id="gw-kafka",
                             publisher_spool_dir=tmp_path / "spool", pii_hash_key="kafka-test-key")
    with FakeUpstream() as upstream:
        app = app_from_settings(settings, upstream=upstream.url, engine="openai")
        with TestClient(app) as client:
            for i in range(3):
                body = {"model": "base-m", "user": f"user-{i}",
                        "messages": [{"role": "user", "content": f"I am {EMAIL}, {PHONE}, card {CARD}, #{i}"}]}
                headers = {"X-Request-Id": f"k-{i}", "traceparent": f"00-{_trace_id(i)}-{CLIENT_PARENT}-01"}
                assert client.post("/v1/chat/completions", json=body, headers=headers).status_code == 200
        publisher = app.state.publish.__self__
        publisher.close(timeout=10)

    topics = [topic_prefix + t.topic for t in (Audit, Span, TokenEntropy)]
    values = _consume_raw(kafka_bootstrap, topics, expected=9)
    assert len(values) == 9
    for raw in values:
        for secret in (EMAIL, PHONE, CARD, CARD.replace(" ", ""), "user-0", "user-1", "user-2"):
            assert secret.encode() not in raw
    records = [codec.decode(v) for v in values]
    for i in range(3):
        mine = [r for r in records if r.request_id == f"k-{i}"]
        assert sorted(type(r).__name__ for r in mine) == ["Audit", "Span", "TokenEntropy"]
        assert {r.trace_id for r in mine} == {_trace_id(i)}  # the client's trace
        (span,) = [r for r in mine if isinstance(r, Span)]
        assert span.parent_span_id == CLIENT_PARENT and span.name == "gateway /v1/chat/completions"
        (audit,) = [r for r in mine if isinstance(r, Audit)]
        assert audit.redactions == {"email": 2, "phone": 2, "bank_card": 2}
        assert audit.node_id == "gw-kafka"


def test_a_large_audit_reaches_kafka_whole_in_parts(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    """A ~2.4 MB audit (prompt echoed back) used to be one record over the limits: the producer
    refused it, or the consumers made it a dead letter. Its parts all reach Kafka, each decodes, and
    joined in part order they give the whole redacted prompt and response."""
    from entroloop.infra.worm.layouts import join_audit_parts

    ensure_topics(kafka_bootstrap, prefix=topic_prefix)
    settings = load_settings(kafka_bootstrap=kafka_bootstrap, topic_prefix=topic_prefix, node_id="gw-large",
                             publisher_spool_dir=tmp_path / "spool", pii_hash_key="kafka-test-key")
    content = (f"mail {EMAIL} 订单 " + "order shipped, please check. " * 100) * 400  # ~1.2 MB
    with FakeUpstream(vllm=True) as upstream:
        app = app_from_settings(settings, upstream=upstream.url, engine="vllm")
        with TestClient(app) as client:
            body = {"model": "base-m", "messages": [{"role": "user", "content": content}]}
            assert client.post("/v1/chat/completions", json=body, headers={"X-Request-Id": "big-1"}).status_code == 200
        publisher = app.state.publish.__self__
        publisher.close(timeout=30)
        assert publisher.stats()["failed"] == 0  # the producer refused no part

    values = _consume_raw(kafka_bootstrap, [topic_prefix + Audit.topic], expected=3)
    parts = [codec.decode(v) for v in values]  # each within the consumers' record limit
    assert len(parts) >= 3 and all(isinstance(p, Audit) and p.request_id == "big-1" for p in parts)
    (joined,) = join_audit_parts([{**msgspec.structs.asdict(p)} for p in parts])
    assert "parts_missing" not in joined and EMAIL not in joined["prompt"] + joined["response"]
    assert joined["response"].startswith("Hello there, mail [EMAIL:") and len(joined["response"]) > len(content)
