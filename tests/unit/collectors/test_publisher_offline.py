"""The publisher with no reachable broker: everything is spooled, counted, kept across restarts.

These run the real librdkafka producer against a closed loopback port (no broker needed); the
broker-backed behaviour (delivery, replay after an outage) is in tests/integration.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from entroloop.collectors.publisher import Publisher, PublisherConfig
from entroloop.collectors.spool import iter_frames

from entroloop.contract import codec
from entroloop.contract.ids import NodeStamper
from entroloop.contract.records import Feedback


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def feedback_records(n: int, node: str = "node-a") -> list[Feedback]:
    stamper = NodeStamper(node)
    return [Feedback(**stamper.stamp(), request_id=f"req-{i}", rating=1) for i in range(n)]


def offline_config(spool_dir: Path, **overrides: object) -> PublisherConfig:
    values: dict[str, object] = {
        "bootstrap": f"127.0.0.1:{closed_port()}",
        "spool_dir": spool_dir,
        "topic_prefix": "unit.",
        "delivery_timeout_ms": 1000,
        "probe_interval_s": 0.2,
    }
    values.update(overrides)
    return PublisherConfig(**values)  # type: ignore[arg-type]


def wait_for(predicate, timeout: float = 15.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def spooled_values(spool_dir: Path) -> list[bytes]:
    return [m.value for path in sorted(spool_dir.glob("*.spool")) for m in iter_frames(path.read_bytes())]


def test_unreachable_broker_spools_everything_in_order_and_keeps_it_after_close(tmp_path: Path) -> None:
    records = feedback_records(500)
    publisher = Publisher(offline_config(tmp_path))
    assert all(publisher.publish(r) for r in records)
    assert wait_for(lambda: publisher.stats()["spooled"] == 500), publisher.stats()
    stats = publisher.close(timeout=0.5)
    assert stats["sent"] == 0 and stats["dropped"] == 0 and stats["spooled"] == 500
    assert stats["spool_bytes"] > 0

    stored = [codec.decode(v) for v in spooled_values(tmp_path)]
    # Never connected, so nothing was in flight: records librdkafka held are purged back into the
    # spool ahead of the later ones, and the spool is in publish order.
    assert [r.seq for r in stored] == [r.seq for r in records]


def test_a_new_publisher_adopts_the_spool_of_a_dead_one(tmp_path: Path) -> None:
    first = Publisher(offline_config(tmp_path))
    for record in feedback_records(20):
        first.publish(record)
    assert wait_for(lambda: first.stats()["spooled"] == 20)
    first.close(timeout=0.2)

    second = Publisher(offline_config(tmp_path))
    try:
        assert second.stats()["spool_bytes"] > 0, "the orphaned spool is adopted for replay"
    finally:
        second.close(timeout=0.2)
    assert len(spooled_values(tmp_path)) == 20, "still nothing lost while the broker stays away"


def test_spool_limit_drops_and_counts(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    one = len(codec.encode(feedback_records(1)[0])) + 64
    publisher = Publisher(offline_config(tmp_path, spool_max_bytes=50 * one))
    for record in feedback_records(300):
        publisher.publish(record)
    assert wait_for(lambda: publisher.stats()["spooled"] + publisher.stats()["dropped"] == 300), publisher.stats()
    stats = publisher.close(timeout=0.2)
    assert stats["dropped"] > 0 and stats["spooled"] < 300
    assert stats["spooled"] + stats["dropped"] == 300
    assert any("DROPPING" in r.message and r.levelname == "ERROR" for r in caplog.records)


def test_full_queue_spools_on_the_callers_thread_instead_of_dropping(tmp_path: Path) -> None:
    publisher = Publisher(offline_config(tmp_path, queue_size=1))
    try:
        results = [publisher.publish(r) for r in feedback_records(200)]
        assert all(results)
        assert wait_for(lambda: publisher.stats()["spooled"] == 200), publisher.stats()
        assert publisher.stats()["dropped"] == 0
    finally:
        publisher.close(timeout=0.2)


def test_records_queued_at_interpreter_exit_land_in_the_spool(tmp_path: Path) -> None:
    """A serving process that exits without close(): the atexit hook spools what is still queued."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        from pathlib import Path
        from entroloop.collectors.publisher import Publisher, PublisherConfig
        from tests.unit.collectors.test_publisher_offline import feedback_records
        publisher = Publisher(PublisherConfig("127.0.0.1:{closed_port()}", Path({str(tmp_path)!r}),
                                              delivery_timeout_ms=1000, queue_size=1_000_000))
        for record in feedback_records(2000):
            publisher.publish(record)
        # no close(): the interpreter exits here
    """)
    root = Path(__file__).resolve().parents[3]
    subprocess.run([sys.executable, "-c", script], cwd=root, check=True, timeout=60)
    assert len(spooled_values(tmp_path)) == 2000


class _RefusedMessage:
    """What librdkafka hands the delivery callback for a record the broker refused."""

    def __init__(self, value: bytes) -> None:
        self._value = value

    def topic(self) -> str:
        return "unit.feedback"

    def key(self) -> bytes:
        return b"req"

    def value(self) -> bytes:
        return self._value


def test_a_refused_topic_logs_one_line_not_one_per_record(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from confluent_kafka import KafkaError

    publisher = Publisher(offline_config(tmp_path))
    refused = KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED)
    assert not refused.retriable()  # a refusal, not an outage: each record is retried alone, then kept
    values = [codec.encode(r) for r in feedback_records(200)]
    caplog.set_level("WARNING", logger="entroloop.collectors.publisher")
    for value in values:
        publisher._on_live_delivery(refused, _RefusedMessage(value))  # noqa: SLF001 - the librdkafka callback
    lines = [r.getMessage() for r in caplog.records if "retrying it alone" in r.getMessage()]
    stats = publisher.close(timeout=0.2)
    assert len(lines) == 1 and "refusals so far: 1" in lines[0], lines
    assert stats["delivery_errors"] == 200 and stats["spooled"] == 200, stats  # every one counted and kept
    assert spooled_values(tmp_path) == values
