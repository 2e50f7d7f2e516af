"""What entroloop writes is the owner's only: 0600 files, 0700 folders, 0400 write-once objects.

Issue 12, finding 2: audit Parquet came out 0444, bus logs, offsets, spools and gateway frame files
0644 (umask 022), so any account on the host could `cat` every prompt and answer. Each writer is
run here under umask 022 (the common default) and its files and folders are checked; modes are set
explicitly, so the umask must not matter.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from entroloop.collectors.spool import Spool
from entroloop.collectors.vllm.emit import FileSink

from entroloop.infra.bus import LocalLog, OffsetStore
from entroloop.infra.private_files import make_private_dir, open_private
from entroloop.infra.quarantine import local_quarantine
from entroloop.infra.worm.worm_store import LocalWormStore
from tests.unit.sinks.sink_records import sample_records


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(autouse=True)
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def test_bus_logs_and_their_folders_are_private(tmp_path):
    log = LocalLog(tmp_path / "log", partitions=2)
    log.append("entroloop.audit.v1", "req-1", b"prompt: my phone is 13900001111", event_id="e1")
    log.flush()
    files = list((tmp_path / "log").rglob("*.log"))
    assert files and all(mode(f) == 0o600 for f in files)
    assert mode(tmp_path / "log") == 0o700
    assert all(mode(f.parent) == 0o700 for f in files)
    log.close()


def test_offsets_are_private(tmp_path):
    offsets = OffsetStore(tmp_path / "offsets.json")
    offsets.commit("entroloop.audit.v1", 0, 5)
    offsets.save()
    assert mode(tmp_path / "offsets.json") == 0o600


def test_an_existing_world_readable_log_is_made_private(tmp_path):
    folder = tmp_path / "log" / "entroloop.audit.v1"
    folder.mkdir(parents=True)
    old = folder / "000.log"
    old.write_bytes(b"")
    old.chmod(0o644)
    log = LocalLog(tmp_path / "log", partitions=1)
    log.append("entroloop.audit.v1", "k", b"v")
    log.flush()
    assert mode(old) == 0o600
    log.close()


def test_audit_objects_are_read_only_for_the_owner_only(tmp_path):
    store = LocalWormStore(tmp_path / "worm")
    store.put_once("audit/entroloop.audit.v1/000/00000000000000000000.parquet", b"PAR1 answers")
    obj = tmp_path / "worm" / "audit" / "entroloop.audit.v1" / "000" / "00000000000000000000.parquet"
    assert mode(obj) == 0o400
    assert mode(tmp_path / "worm") == 0o700
    assert all(mode(p) == 0o700 for p in (tmp_path / "worm").rglob("*") if p.is_dir())


def test_the_publisher_spool_is_private(tmp_path):
    spool = Spool(tmp_path / "spool" / "node.spool", max_bytes=1 << 20)
    spool.append("entroloop.audit.v1", b"k", b"prompt text")
    spool.append("entroloop.audit.v1", b"k", b"another prompt")
    spool.sync()
    spool.advance(spool.read_pending(10)[0].end)  # one delivered, one pending: the cursor is written
    assert mode(tmp_path / "spool") == 0o700
    assert mode(tmp_path / "spool" / "node.spool") == 0o600
    assert mode(tmp_path / "spool" / "node.spool.cursor") == 0o600
    spool.close()


def test_gateway_frame_files_are_private(tmp_path):
    token = sample_records(1, seed=3)["entroloop.tokens.v1"][0]
    sink = FileSink(tmp_path / "collectors" / "frames-{pid}.bin")
    sink(token)
    sink.close()
    (frames,) = list((tmp_path / "collectors").iterdir())
    assert mode(frames) == 0o600 and mode(tmp_path / "collectors") == 0o700


def test_quarantine_objects_are_read_only_for_the_owner_only(tmp_path):
    quarantine = local_quarantine(tmp_path)
    quarantine.put("0190a1b2-0000-7000-8000-000000000001", b"raw")
    (obj,) = [p for p in (tmp_path / "quarantine").rglob("*") if p.is_file()]
    assert mode(obj) == 0o400 and mode(tmp_path / "quarantine") == 0o700


def test_helpers_ignore_the_umask(tmp_path):
    os.umask(0)
    folder = make_private_dir(tmp_path / "a" / "b")
    assert mode(folder) == 0o700 and mode(tmp_path / "a") == 0o700
    with open_private(folder / "f", "wb") as fh:
        fh.write(b"x")
    assert mode(folder / "f") == 0o600


def test_the_chdb_folder_is_private(tmp_path):
    """Its own process: chDB opens one folder per process."""
    folder = tmp_path / "data" / "clickhouse"
    code = (
        "import os; os.umask(0o022)\n"
        "from entroloop.infra.clickhouse.client import connect\n"
        f"connect('chdb://{folder}').command('SELECT 1')\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    assert mode(folder) == 0o700
