"""Fixtures shared by every test folder.

chDB runs one ClickHouse engine per process and it can open only ONE data folder per process
("EmbeddedServer already initialized with path ..."). So the test session owns one chDB folder and
each test that needs isolation gets its own *database* in it, never its own folder. Tests that
need a second folder run it in a subprocess.
"""

from __future__ import annotations

import importlib.util
import uuid

import pytest

from entroloop.infra.clickhouse.client import connect

# The heavy suite runs in .venv-ml (torch + vLLM), which cannot also hold faust-streaming (its
# click pin conflicts with vLLM's). Modules that import faust are the light suite's; there faust is
# always installed, so nothing is ignored.
IN_ML_ENV = importlib.util.find_spec("torch") is not None and importlib.util.find_spec("faust") is None
# every test module that imports faust, directly or through the worker's modules (a light-suite
# test, tests/unit/test_faust_test_modules.py, finds them and fails when one is missing here)
FAUST_TEST_MODULES = [
    "unit/streams/test_streams_app.py",
    "unit/streams/test_faust_offsets.py",
    "unit/streams/test_faust_recovery_watch.py",
    "unit/streams/test_faust_drain.py",
    "unit/streams/test_faust_lean.py",
    "unit/streams/test_faust_delivery.py",
    "unit/streams/test_faust_batches.py",
    "unit/streams/test_faust_take.py",
    "unit/streams/test_state_partitions.py",
    "unit/streams/test_worker_bookkeeping.py",
    "integration/test_worker_produce_kafka.py",
]
collect_ignore = FAUST_TEST_MODULES if IN_ML_ENV else []


@pytest.fixture(scope="session")
def chdb_dsn(tmp_path_factory) -> str:
    return f"chdb://{tmp_path_factory.mktemp('chdb-session')}"


@pytest.fixture(scope="session")
def chdb_client(chdb_dsn):
    return connect(chdb_dsn)


@pytest.fixture
def ch_database() -> str:
    """A fresh, unique database name for one test (created by whoever migrates it)."""
    return f"t_{uuid.uuid4().hex[:12]}"


@pytest.fixture
def receiver():
    """A local HTTP server recording the webhook calls it gets (``webhook_receiver.WebhookReceiver``)."""
    from tests.unit.streams.actions.webhook_receiver import WebhookReceiver

    server = WebhookReceiver()
    yield server
    server.close()
