"""Sink benchmarks: rows/s into ClickHouse (chDB) per sink process, audit Parquet MB/s, verify speed.

Each measurement runs the production code path on synthetic records shaped like the fleet's
(realistic sizes: ~200 entropy values per request, prompts and answers of a few hundred
characters), in one process, and returns plain numbers; ``entroloop bench sinks`` prints them.
"""

from __future__ import annotations

import random
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from entroloop.contract.codec import decode_many, encode
from entroloop.contract.ids import uuid7
from entroloop.contract.records import Audit, Event, Span, TokenEntropy, pack_entropies

WORDS = (
    "the model answered question about invoice refund policy shipping delay account password reset "
    "error timeout latency gpu cluster adapter training data customer support contract clause summary "
    "translate german french code python function bug stack trace memory leak database index query"
).split()


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choices(WORDS, k=words))


def token_records(n: int, seed: int = 1, start: float | None = None) -> list[TokenEntropy]:
    rng = np.random.default_rng(seed)
    start = time.time() - 600 if start is None else start
    out = []
    for i in range(n):
        at = start + i * 0.001
        out.append(TokenEntropy(
            event_id=uuid7(at), emitted_at=at, node_id=f"node-{i % 8}", seq=i, request_id=f"r{seed}-{i}",
            trace_id=f"{i:032x}", model=("qwen", "llama", "glm")[i % 3], route=("chat", "code")[i % 2],
            entropies=pack_entropies(rng.gamma(2.0, 1.2, size=int(rng.integers(50, 350)))),
        ))
    return out


def span_records(n: int, seed: int = 2, start: float | None = None) -> list[Span]:
    rng = random.Random(seed)
    start = time.time() - 600 if start is None else start
    out = []
    for i in range(n):
        at = start + i * 0.001
        ttft, tpot, tokens = rng.uniform(0.02, 0.4), rng.uniform(0.01, 0.05), rng.randint(10, 400)
        out.append(Span(
            event_id=uuid7(at), emitted_at=at, node_id=f"node-{i % 8}", seq=i, request_id=f"r{seed}-{i}",
            trace_id=f"{i:032x}", span_id=f"{i:016x}", name="llm_request", start_time=at,
            end_time=at + ttft + tpot * tokens, model=("qwen", "llama", "glm")[i % 3], route="chat",
            queue_s=0.01, prefill_s=ttft - 0.01, decode_s=tpot * tokens, ttft_s=ttft, tpot_s=tpot,
            e2e_s=ttft + tpot * tokens, prompt_tokens=rng.randint(20, 2000), output_tokens=tokens,
            attributes={"gpu": "0"},
        ))
    return out


def audit_records(n: int, seed: int = 3, start: float | None = None) -> Iterator[Audit]:
    rng = random.Random(seed)
    start = time.time() - 600 if start is None else start
    for i in range(n):
        at = start + i * 0.0005
        yield Audit(
            event_id=uuid7(at), emitted_at=at, node_id=f"node-{i % 8}", seq=i, request_id=f"r{seed}-{i}",
            trace_id=f"{i:032x}", audit_id=str(uuid.UUID(int=rng.getrandbits(128))), model=("qwen", "llama", "glm")[i % 3],
            prompt=_text(rng, rng.randint(10, 60)), response=_text(rng, rng.randint(20, 120)),
            tenant=f"tenant-{i % 5}", user_id=f"u_{rng.randint(0, 9999):04d}", prompt_template_version="v3",
            sampling={"temperature": 0.7, "top_p": 0.95}, engine_version="vllm-0.9", language="en",
        )


CLICKHOUSE_STAGES = ("decode", "arrow", "insert")


def clickhouse_rows_per_s(rows: int = 200_000, batch_rows: int = 50_000, client: Any = None,
                          database: str = "bench") -> dict[str, dict[str, float]]:
    """Rows/s one sink process inserts into chDB per table, end to end and per stage.

    The production path on MessagePack payloads: ``decode_many`` (validation included), then
    ``ClickHouseSink.write`` (Arrow build + one idempotent insert per batch, rollup views firing).
    Per table: ``end_to_end`` (all stages, one after the other, as a sink runs them), the same per
    CPU-second of the process (``end_to_end_per_cpu_s``: what one core does, whatever else loads the
    machine; background merges included) and the rate of each stage alone per CPU-second (decode
    and Arrow: the sink's thread; insert: the whole process, as chDB works in threads of its own) (``decode``, ``arrow``, ``insert``), so the stage that caps it is visible.
    Without ``client`` it runs in a chDB folder of its own (chDB opens one folder per process).
    """
    if client is None:
        with own_chdb() as own:
            return clickhouse_rows_per_s(rows, batch_rows, own, database)
    from entroloop.sinks.clickhouse.writer import ClickHouseSink

    sink = ClickHouseSink(client, database)
    figures: dict[str, dict[str, float]] = {}
    for name, make in (("token_entropy", token_records), ("spans", span_records)):
        records: list[Event] = make(rows)
        payloads = [encode(r) for r in records]
        topic = records[0].topic
        del records
        before = dict(sink.stage_cpu_seconds)
        decode_seconds = 0.0
        loop_started, cpu_started = time.perf_counter(), time.process_time()
        for first in range(0, rows, batch_rows):
            started = time.thread_time()
            batch = decode_many(payloads[first : first + batch_rows])
            decode_seconds += time.thread_time() - started
            sink.write(topic, 0, first, first + len(batch) - 1, batch)
        total_seconds = time.perf_counter() - loop_started
        cpu_seconds = time.process_time() - cpu_started  # every thread of the process, chDB's included
        seconds = {"decode": decode_seconds, **{k: sink.stage_cpu_seconds[k] - before[k] for k in before}}
        if sink.count(name) != rows:
            raise RuntimeError(f"benchmark table {name} holds {sink.count(name)} rows, expected {rows}")
        figures[name] = {"end_to_end": rows / total_seconds, "end_to_end_per_cpu_s": rows / cpu_seconds,
                         **{stage: rows / seconds[stage] for stage in CLICKHOUSE_STAGES}}
    return figures


@contextmanager
def own_chdb() -> Iterator[Any]:
    """A chDB client on a scratch folder, removed afterwards."""
    from entroloop.infra.clickhouse.client import connect

    with tempfile.TemporaryDirectory(prefix="bench-chdb-") as folder:
        client = connect(f"chdb://{folder}")
        try:
            yield client
        finally:
            client.close()


def audit_write_and_verify(events: int = 1_000_000, batch: int = 2_000, partitions: int = 6,
                           progress: Callable[[int], None] | None = None) -> dict[str, float]:
    """Write ``events`` audit records through the WORM Parquet writer, verify the whole log, then time
    a restarted writer opening every chain (it reads back the ids of the newest batches)."""
    from entroloop.sinks.audit.parquet_writer import AuditParquetWriter
    from entroloop.sinks.audit.verify import verify_store

    from entroloop.infra.worm.worm_store import LocalWormStore

    with tempfile.TemporaryDirectory(prefix="bench-audit-") as folder:
        store = LocalWormStore(Path(folder) / "worm")
        writer = AuditParquetWriter(store)
        offsets = [0] * partitions
        write_seconds = 0.0
        pending: list[Audit] = []
        written = 0

        def flush(records: list[Audit], partition: int) -> float:
            first = offsets[partition]
            started = time.perf_counter()
            writer.write(Audit.topic, partition, first, first + len(records) - 1, records)
            offsets[partition] += len(records)
            return time.perf_counter() - started

        for record in audit_records(events):
            pending.append(record)
            if len(pending) == batch:
                write_seconds += flush(pending, (written // batch) % partitions)
                written += len(pending)
                pending = []
                if progress:
                    progress(written)
        if pending:
            write_seconds += flush(pending, (written // batch) % partitions)
            written += len(pending)
        report = verify_store(store)
        if not report.ok or report.records != events:
            raise RuntimeError(f"verification of the benchmark log failed: {report.problems[:3]}")
        started = time.perf_counter()  # a restarted writer opens every chain, reading back recent ids
        restarted = AuditParquetWriter(store)
        for partition in range(partitions):
            restarted.chain(Audit.topic, partition)
        reopen_seconds = time.perf_counter() - started
        _restore_write_bits(Path(folder))
        return {
            "events": float(events),
            "parquet_mb": writer.bytes_written / 1e6,
            "parquet_mb_per_s": writer.bytes_written / 1e6 / write_seconds,
            "audit_records_per_s": events / write_seconds,
            "verify_seconds": report.seconds,
            "verify_events_per_s": events / report.seconds,
            "files": float(report.files),
            "reopen_seconds": reopen_seconds,
            "reopen_ids": float(len(restarted.recent)),
        }


def _restore_write_bits(folder: Path) -> None:
    """Read-only audit files would stop TemporaryDirectory from cleaning up."""
    for path in folder.rglob("*"):
        path.chmod(0o755 if path.is_dir() else 0o644)
