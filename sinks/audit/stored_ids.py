"""The event ids of a chain's newest sealed batches, read back so a restarted writer still drops copies.

The audit writer leaves out a record whose event id it stored lately (``entroloop.sinks.recent_ids``:
a publisher's spool replay re-sent it at another offset). That memory is per process, so a copy
arriving right after a restart would become a second row in the write-once log, for good. When the
writer opens a chain it therefore reads back the ids of the chain's newest ``batches`` sealed
batches, walking from the head along the manifests' ``prev`` links.

Only sealed batches count: a batch whose data files were written but whose manifest was not (a crash
between them) is not in the chain, so its redelivery is filtered as before and its earlier attempt
is recognised by ``AuditParquetWriter._put_group``. Each manifest must hash to what the next one (or
the head) names and each data file to its manifest entry; the walk stops at the first link that does
not, with a warning, so a planted object cannot teach the writer to drop records it never stored.
"""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

from entroloop.infra.worm.manifest import Manifest, sha256_hex
from entroloop.infra.worm.parquet_bytes import read_parquet
from entroloop.infra.worm.s3_store import S3Unavailable
from entroloop.infra.worm.worm_store import WormStore

log = logging.getLogger("entroloop.sinks.audit")

# Batches read back per chain at start. At fleet rates (2,000 requests/s over 6 partitions, one batch
# per second per partition) that is the last ~100 s of records; on quieter traffic, longer.
SEED_BATCHES = 100
_FETCHERS = 8  # data files are fetched in parallel: on S3 each GET is a round trip


def chained_event_ids(store: WormStore, head_key: str, head_sha256: str, batches: int = SEED_BATCHES,
                      limit: int | None = None) -> list[str]:
    """The event ids held by the newest ``batches`` batches of the chain ending at ``head_key`` (and
    no more batches than hold ``limit`` records), oldest first; fewer when a link does not verify
    (warned; ``entroloop audit verify`` says more)."""
    files: list[tuple[str, str]] = []  # (key, sha256), newest batch first
    key, expected, records = head_key, head_sha256, 0
    try:
        for _ in range(batches):
            if not key or (limit is not None and records >= limit):
                break  # the chain's first batch was read, or as many records as the memory keeps
            data = store.get(key)
            if sha256_hex(data) != expected:
                log.warning("%s does not hash to what the chain names; recent ids read back only up to it "
                            "(run `entroloop audit verify`)", key)
                break
            manifest = Manifest.from_bytes(data)
            files += [(f.key, f.sha256) for f in reversed(manifest.files)]
            records += manifest.records
            key, expected = manifest.prev_manifest_key, manifest.prev_manifest_sha256
        with ThreadPoolExecutor(_FETCHERS) as pool:
            blobs = list(pool.map(store.get, [k for k, _ in files]))
    except S3Unavailable:
        raise
    except Exception as exc:  # noqa: BLE001 - a broken store is verify's to report; the writer still starts
        log.warning("recent ids not read back from %s: %s (run `entroloop audit verify`)", head_key, exc)
        return []
    ids: list[str] = []
    for (key, sha), blob in zip(files, blobs, strict=True):
        if sha256_hex(blob) != sha:
            log.warning("%s does not hash to its manifest entry; recent ids read back only up to it "
                        "(run `entroloop audit verify`)", key)
            break
        column = read_parquet(blob, columns=["event_id"]).column("event_id")
        ids += reversed(column.to_pylist())
    ids.reverse()
    return ids


__all__ = ["SEED_BATCHES", "chained_event_ids"]
