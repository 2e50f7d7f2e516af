"""Fixtures for tests that talk to real services started by ``scripts/services.sh up``.

A missing service is a failure with the command that fixes it, never a skip: a green run must
mean the broker was really there.
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVICES_ENV = REPO_ROOT / ".services.env"


def service_setting(name: str) -> str:
    """A service address from the environment, else from ``.services.env`` (written by services.sh)."""
    if os.environ.get(name):
        return os.environ[name]
    if SERVICES_ENV.exists():
        for line in SERVICES_ENV.read_text().splitlines():
            key, sep, value = line.strip().partition("=")
            if sep and key == name:
                return value.strip()
    return ""


def _reachable(host: str, port: int, timeout: float = 3.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


@pytest.fixture(scope="session")
def kafka_bootstrap() -> str:
    """``host:port`` of the real Kafka broker; fails (does not skip) when it is not running."""
    bootstrap = service_setting("ENTROLOOP_KAFKA_BOOTSTRAP")
    if not bootstrap:
        pytest.fail(
            "ENTROLOOP_KAFKA_BOOTSTRAP is not set and .services.env has no broker: "
            "start it with `make services-up` (or `bash scripts/services.sh up`)",
            pytrace=False,
        )
    host, _, port = bootstrap.split(",")[0].rpartition(":")
    if not _reachable(host, int(port)):
        pytest.fail(
            f"Kafka broker {bootstrap} is not reachable: start it with `make services-up` "
            "(logs in .services/kafka/)",
            pytrace=False,
        )
    return bootstrap


@pytest.fixture
def topic_prefix() -> Iterator[str]:
    """A topic prefix unique to this test, so tests sharing one broker never see each other's data.

    Afterwards the test's topics (Faust's internal ones included: they carry the prefix too) are
    deleted, so a long-lived broker does not pile up thousands of partitions and restart slowly.
    """
    prefix = f"t{uuid.uuid4().hex[:12]}."
    yield prefix
    delete_topics_with_prefix(prefix)


def delete_topics_with_prefix(prefix: str) -> None:
    bootstrap = service_setting("ENTROLOOP_KAFKA_BOOTSTRAP")
    if not bootstrap:
        return
    try:
        from confluent_kafka.admin import AdminClient

        admin = AdminClient({"bootstrap.servers": bootstrap, "socket.connection.setup.timeout.ms": 3000})
        names = [t for t in admin.list_topics(timeout=5).topics if t.startswith(prefix)]
        if names:
            for future in admin.delete_topics(names, operation_timeout=10).values():
                future.result(timeout=15)
    except Exception as exc:  # noqa: BLE001 - cleanup must never fail a test that passed
        print(f"note: could not delete topics {prefix}*: {exc}")
