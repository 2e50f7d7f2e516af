"""A SIGKILL at a chosen point of an audit batch's write, for the tests of what a retry does."""

from __future__ import annotations

from entroloop.sinks.audit.parquet_writer import AuditParquetWriter

from entroloop.contract.records import Audit
from entroloop.infra.worm.worm_store import LocalWormStore

TOPIC = Audit.topic


class Crash(BaseException):
    """A SIGKILL between a batch's data file and its manifest: nothing after it runs."""


def crash_before_the_manifest(store: LocalWormStore, writer: AuditParquetWriter, first: int, last: int,
                              batch: list[Audit]) -> None:
    """``writer`` writes the batch's data files and dies as it puts the manifest."""
    real_put = store.put_once

    def put_then_crash(key, data):
        if key.startswith("manifests/"):
            raise Crash()
        return real_put(key, data)

    store.put_once = put_then_crash
    try:
        writer.write(TOPIC, 0, first, last, batch)
    except Crash:
        pass
    finally:
        store.put_once = real_put
