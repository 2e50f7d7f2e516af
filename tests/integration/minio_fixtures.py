"""Fixtures for the MinIO (S3 Object Lock) tests: a real MinIO server on loopback.

The binary is the one ``scripts/minio.sh build`` makes from MinIO's Go module (cached outside the
clone). Tests that only need S3 use the server ``scripts/minio.sh up`` started when
``ENTROLOOP_S3_ENDPOINT`` is set (``make test`` sources .services.env), else one of their own;
the restart test always starts its own, since it stops and starts the server it uses.
Import the fixtures into a test module with ``from tests.integration.minio_fixtures import *``.
"""

from __future__ import annotations

import os
import socket
import subprocess
import time
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ACCESS_KEY = "entroloop"
SECRET_KEY = "entroloop-test-secret"

__all__ = ["MinioServer", "minio_binary", "minio_endpoint", "own_minio", "s3_client", "locked_bucket"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def minio_binary() -> str:
    """The cached MinIO binary, built by scripts/minio.sh on first use."""
    done = subprocess.run(["bash", str(ROOT / "scripts" / "minio.sh"), "build"], capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"scripts/minio.sh build failed:\n{done.stderr[-2000:]}")
    return done.stdout.strip().splitlines()[-1]


class MinioServer:
    """One MinIO process on 127.0.0.1 that a test may stop and start again on the same data."""

    def __init__(self, binary: str, data_dir: Path, port: int | None = None) -> None:
        self.binary = binary
        self.data_dir = data_dir
        self.port = port or _free_port()
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> None:
        env = {**os.environ, "MINIO_ROOT_USER": ACCESS_KEY, "MINIO_ROOT_PASSWORD": SECRET_KEY,
               "MINIO_BROWSER": "off", "MINIO_UPDATE": "off", "MINIO_CALLHOME_ENABLE": "off"}
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = open(self.data_dir.parent / f"minio-{self.port}.log", "ab")
        self.process = subprocess.Popen(
            [self.binary, "server", str(self.data_dir), "--address", f"127.0.0.1:{self.port}", "--quiet"],
            env=env, stdout=log, stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"MinIO exited with {self.process.returncode}; see {log.name}")
            try:
                with urllib.request.urlopen(f"{self.endpoint}/minio/health/ready", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"MinIO not ready on {self.endpoint} after {timeout}s")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self.process = None


@pytest.fixture(scope="session")
def minio_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The shared test MinIO (scripts/minio.sh up) or, without one, a session-wide server of our own."""
    shared = os.environ.get("ENTROLOOP_S3_ENDPOINT", "")
    if shared:
        yield shared
        return
    server = MinioServer(minio_binary(), tmp_path_factory.mktemp("minio") / "data")
    server.start()
    yield server.endpoint
    server.stop()


@pytest.fixture
def own_minio(tmp_path: Path) -> Iterator[MinioServer]:
    """A MinIO server for this test alone (it may be stopped and restarted)."""
    server = MinioServer(minio_binary(), tmp_path / "data")
    server.start()
    yield server
    server.stop()


def s3_client(endpoint: str):
    from entroloop.infra.worm.s3_store import make_s3_client

    return make_s3_client(
        endpoint, "us-east-1",
        os.environ.get("ENTROLOOP_S3_ACCESS_KEY", ACCESS_KEY) if endpoint == os.environ.get("ENTROLOOP_S3_ENDPOINT") else ACCESS_KEY,
        os.environ.get("ENTROLOOP_S3_SECRET_KEY", SECRET_KEY) if endpoint == os.environ.get("ENTROLOOP_S3_ENDPOINT") else SECRET_KEY,
    )


@pytest.fixture
def locked_bucket(minio_endpoint: str) -> tuple[object, str]:
    """A fresh uuid-named bucket created with Object Lock, and a client for it."""
    from entroloop.infra.worm.s3_store import ensure_bucket

    client = s3_client(minio_endpoint)
    bucket = f"audit-{uuid.uuid4().hex[:16]}"
    assert ensure_bucket(client, bucket) is True
    return client, bucket
