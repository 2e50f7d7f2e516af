"""An audit log written by the real audit sink (Kafka -> write-once Parquet) is tampered with in four
ways, each on its own copy; `entroloop audit verify` finds and names every one (exit 1), and the
untouched log verifies clean with every (node_id, seq) exactly once.

Local objects are read-only (0444): each tampering starts with a deliberate chmod, as an intruder's would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

from confluent_kafka import Producer

from entroloop.contract import codec
from entroloop.contract.records import Audit
from entroloop.contract.topics import partition_for
from entroloop.infra.kafka_topics import ensure_topics
from entroloop.infra.worm.manifest import Manifest
from entroloop.infra.worm.worm_store import LocalWormStore
from tests.reliability.harness import (
    PYTHON,
    REPO_ROOT,
    Figures,
    audit_identities,
    check_exactly_once,
    fleet_records,
    identity,
    report,
    run_sink,
    sink_env,
)

PARTITIONS = 2


def verify_cli(data_dir: Path) -> tuple[int, dict]:
    done = subprocess.run([PYTHON, "-m", "entroloop.cli", "audit", "verify", "--data-dir", str(data_dir),
                           "--store", "local", "--json"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=120)
    return done.returncode, json.loads(done.stdout.strip().splitlines()[-1])


def writable(path: Path) -> Path:
    os.chmod(path, 0o644)
    return path


def flip_a_byte(root: Path, store: LocalWormStore) -> tuple[str, str]:
    key = store.list("audit/")[1]
    path = writable(root / key)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    return "modified", key


def delete_a_file(root: Path, store: LocalWormStore) -> tuple[str, str]:
    key = store.list("audit/")[0]
    writable(root / key).unlink()
    return "missing", key


def swap_two_batches(root: Path, store: LocalWormStore) -> tuple[str, str]:
    """Two files of consecutive batches of one chain (same model and day folder) trade places."""
    by_folder: dict[str, list[str]] = {}
    for key in store.list("manifests/"):
        if key.endswith(".json") and "-p" in key:
            try:
                manifest = Manifest.from_bytes(store.get(key))
            except Exception:  # noqa: BLE001 - heads and other files are not manifests
                continue
            for f in manifest.files:
                by_folder.setdefault(f.key.rsplit("/", 1)[0], []).append(f.key)
    a, b = next(keys for keys in by_folder.values() if len(keys) >= 2)[:2]
    pa, pb = writable(root / a), writable(root / b)
    tmp = pa.with_name("swap.tmp")
    pa.rename(tmp)
    pb.rename(pa)
    tmp.rename(pb)
    return "reordered", a


def insert_a_forged_file(root: Path, store: LocalWormStore) -> tuple[str, str]:
    real = store.list("audit/")[0]
    forged = real.rsplit("/", 1)[0] + f"/{Audit.topic}-p000-000000090000-000000090024.parquet"
    (root / forged).write_bytes(store.get(real))  # a plausible name and valid Parquet
    return "inserted", forged


TAMPERINGS = {"one byte flipped": flip_a_byte, "a file deleted": delete_a_file,
              "two batches swapped": swap_two_batches, "a forged file inserted": insert_a_forged_file}


def test_audit_log_tampered_four_ways_each_detected(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    ensure_topics(kafka_bootstrap, topic_prefix, PARTITIONS)
    audits = [r for r in fleet_records(400, seed=71) if isinstance(r, Audit)]
    producer = Producer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for r in audits:
        producer.produce(topic_prefix + r.topic, key=r.request_id.encode(), value=codec.encode(r),
                         partition=partition_for(r.request_id, PARTITIONS))
    assert producer.flush(60) == 0
    clean = tmp_path / "clean"
    code, stats, err = run_sink("audit", sink_env(kafka_bootstrap, topic_prefix, clean, PARTITIONS),
                                "--batch-rows", "40", "--batch-seconds", "0.2")
    assert code == 0, err[-3000:]
    code, verdict = verify_cli(clean)
    assert code == 0 and verdict["ok"], verdict
    unique, twice, lost = check_exactly_once([identity(a) for a in audits],
                                             audit_identities(LocalWormStore(clean / "worm")), "audit")
    assert lost == 0 and twice == 0

    detected: dict[str, list[str]] = {}
    started = time.monotonic()
    for name, tamper in TAMPERINGS.items():
        copy = tmp_path / name.replace(" ", "-")
        shutil.copytree(clean, copy)
        kind, key = tamper(copy / "worm", LocalWormStore(copy / "worm"))
        code, verdict = verify_cli(copy)
        found = {(p["kind"], p["key"]) for p in verdict["problems"]}
        detected[name] = sorted({k for k, _ in found})
        assert code == 1, f"{name}: verify passed a tampered log"
        assert (kind, key) in found, f"{name}: expected {kind} {key}, found {found}"
    report(Figures(
        "audit log tampered 4 ways (copies of one sink-written log)",
        sent=len(audits),
        stored={"audit": unique},
        lost=lost,
        note="detected: " + "; ".join(f"{n} -> {'/'.join(k)}" for n, k in detected.items())
        + f"; 4 verifies in {time.monotonic() - started:.1f} s",
    ))
