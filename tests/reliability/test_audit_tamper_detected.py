"""An audit log written by the real audit sink (Kafka -> write-once Parquet) is tampered with in four
ways, each on its own copy; `entroloop audit verify` finds and names every one (exit 1), and the
untouched log verifies clean with every (node_id, seq) exactly once.

The sink signs a checkpoint after every batch (ENTROLOOP_AUDIT_SIGNING_KEY_FILE) into a folder outside
the data folder. Four more attacks by someone with write access to the data folder leave the log
internally consistent — the newest batch dropped, a whole chain deleted, history rewritten with
recomputed hashes, Merkle roots and heads, a forged batch appended — so verify without the public key
says "intact" (it did for all four before checkpoints existed); with the public key and the
checkpoints it names each one (exit 1).

Local objects are read-only (0444): each tampering starts with a deliberate chmod, as an intruder's would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path


from entroloop.contract import codec
from entroloop.contract.records import Audit
from entroloop.contract.topics import partition_for
from entroloop.infra.kafka_topics import ensure_topics
from entroloop.infra.worm.checkpoints import generate_key_pair
from entroloop.infra.worm.manifest import Manifest
from entroloop.infra.worm.worm_store import LocalWormStore
from tests.integration.acknowledged_producer import AcknowledgedProducer
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
from tests.unit.sinks.audit_attacks import (
    append_forged_batch,
    delete_chain,
    drop_newest_batch,
    rewrite_history,
)

PARTITIONS = 2


def verify_cli(data_dir: Path, *extra: str) -> tuple[int, dict]:
    done = subprocess.run([PYTHON, "-m", "entroloop.cli", "audit", "verify", "--data-dir", str(data_dir),
                           "--store", "local", "--json", *extra], cwd=REPO_ROOT, capture_output=True, text=True,
                          timeout=120)
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

# attacks that keep the log internally consistent: (attack on the copy's store, the kind verify must name)
CONSISTENT_ATTACKS = {
    "newest batch dropped": (lambda store: drop_newest_batch(store, 0), "truncated"),
    "a whole chain deleted": (lambda store: delete_chain(store, 1), "missing"),
    "history rewritten, hashes recomputed": (lambda store: rewrite_history(store, 0), "rewritten"),
    "a forged batch appended": (
        lambda store: append_forged_batch(store, [r for r in fleet_records(40, seed=5) if isinstance(r, Audit)][:5], 0),
        "unanchored",
    ),
}


def test_audit_log_tampered_four_ways_each_detected(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path) -> None:
    ensure_topics(kafka_bootstrap, topic_prefix, PARTITIONS)
    audits = [r for r in fleet_records(400, seed=71) if isinstance(r, Audit)]
    producer = AcknowledgedProducer({"bootstrap.servers": kafka_bootstrap, "enable.idempotence": True, "linger.ms": 5})
    for r in audits:
        producer.produce(topic_prefix + r.topic, key=r.request_id.encode(), value=codec.encode(r),
                         partition=partition_for(r.request_id, PARTITIONS))
    assert producer.flush(60) == 0
    clean = tmp_path / "clean"
    private_key, public_key = generate_key_pair(tmp_path / "keys")  # outside every data folder
    checkpoints = tmp_path / "anchor" / "checkpoints"
    env = sink_env(kafka_bootstrap, topic_prefix, clean, PARTITIONS,
                   ENTROLOOP_AUDIT_SIGNING_KEY_FILE=str(private_key), ENTROLOOP_AUDIT_CHECKPOINT_DIR=str(checkpoints))
    code, stats, err = run_sink("audit", env, "--batch-rows", "40", "--batch-seconds", "0.2")
    assert code == 0, err[-3000:]
    code, verdict = verify_cli(clean)
    assert code == 0 and verdict["ok"], verdict
    anchored = ("--public-key", str(public_key), "--checkpoint", str(checkpoints))
    code, verdict = verify_cli(clean, *anchored)
    assert code == 0 and verdict["ok"] and verdict["anchor"]["mode"] == "signed checkpoints", verdict
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
    for name, (attack, kind) in CONSISTENT_ATTACKS.items():
        copy = tmp_path / name.replace(" ", "-").replace(",", "")
        shutil.copytree(clean, copy)
        attack(LocalWormStore(copy / "worm"))
        code, verdict = verify_cli(copy)
        assert code == 0 and verdict["ok"], f"{name}: consistent, so the folder alone cannot tell: {verdict}"
        code, verdict = verify_cli(copy, *anchored)
        detected[name] = sorted({p["kind"] for p in verdict["problems"]})
        assert code == 1, f"{name}: verify against the signed checkpoints passed an attacked log"
        assert kind in detected[name], f"{name}: expected {kind}, found {verdict['problems']}"
    report(Figures(
        "audit log tampered 8 ways (copies of one sink-written log; 4 consistent ones caught by signed checkpoints)",
        sent=len(audits),
        stored={"audit": unique},
        lost=lost,
        note="detected: " + "; ".join(f"{n} -> {'/'.join(k)}" for n, k in detected.items())
        + f"; {len(TAMPERINGS) + 2 * len(CONSISTENT_ATTACKS)} verifies in {time.monotonic() - started:.1f} s",
    ))
