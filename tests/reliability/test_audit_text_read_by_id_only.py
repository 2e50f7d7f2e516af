"""A hostile but fair reader of an embedded deployment: audit text only by audit id or user id.

Issue 12, finding 2, reproduced as a user would, with the CLI and the files a demo writes (umask
022, the common default): another account on the host reading the data folder, an analyst using
`entroloop query` to search every answer through `file(...)` or to read the host's files, and the
dead letters' payloads searchable in ClickHouse. After the fix: the folder is the owner's only,
the query is refused with exit 2, dead letters hold a SHA-256 and the raw bytes come back by id
from the quarantine, whole and unaltered.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

CLI = [sys.executable, "-m", "entroloop.cli"]


def cli(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENTROLOOP_")}
    proc = subprocess.run([*CLI, *args], capture_output=True, env=env, timeout=600, check=False,
                          preexec_fn=lambda: os.umask(0o022))
    if check and proc.returncode != 0:
        raise AssertionError(f"entroloop {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-3000:]!r}")
    return proc


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> Path:
    data_dir = tmp_path_factory.mktemp("hostile-reader") / "data"
    cli("demo", "--requests", "300", "--data-dir", str(data_dir), "--json")  # poison records at request 250
    return data_dir


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_other_accounts_cannot_read_anything_the_demo_wrote(demo):
    assert mode(demo) == 0o700
    for folder in ("log", "worm", "quarantine", "clickhouse", "actions"):
        assert mode(demo / folder) == 0o700, folder
    readable = [f"{mode(p):o} {p.relative_to(demo)}" for p in demo.rglob("*")
                if "clickhouse" not in p.relative_to(demo).parts and mode(p) & 0o077]
    assert not readable, readable
    parquet = list((demo / "worm" / "audit").rglob("*.parquet"))
    assert parquet and all(mode(p) == 0o400 for p in parquet)


def test_query_cannot_search_the_audit_log_or_read_the_host(demo):
    for sql in (
        f"SELECT prompt FROM file('{demo}/worm/audit/*/*/*.parquet', Parquet) WHERE prompt != ''",
        "SELECT * FROM file('/etc/passwd', LineAsString)",
        "SELECT file('/etc/passwd')",
        f"INSERT INTO FUNCTION file('{demo}/out.csv', CSV) SELECT 1",
        "SELECT * FROM url('http://127.0.0.1:9/x', CSV)",
        "SELECT * FROM s3('http://127.0.0.1:9/b/*.parquet', Parquet)",
    ):
        proc = cli("query", sql, "--data-dir", str(demo), "--json", check=False)
        assert proc.returncode == 2, (sql, proc.stderr[-500:])
        assert b"query refused" in proc.stderr and not proc.stdout.strip(), sql
    assert not (demo / "out.csv").exists()
    # the dashboards' queries still run
    rows = cli("query", "SELECT count() AS n FROM entroloop.audit_index FINAL", "--data-dir", str(demo), "--json")
    assert json.loads(rows.stdout)["n"] == 300


def test_dead_letters_hold_a_hash_and_the_quarantine_gives_the_bytes_by_id(demo):
    out = cli("query", "SELECT toString(event_id) AS id, payload, payload_sha256, payload_size "
              "FROM entroloop.dead_letters FINAL", "--data-dir", str(demo), "--json").stdout
    letters = [json.loads(line) for line in out.decode().splitlines()]
    assert letters, "the demo injects poison records"
    assert all(letter["payload"] == "" for letter in letters)
    for letter in letters:
        target = demo.parent / f"{letter['id']}.bin"
        cli("audit", "quarantine", letter["id"], "--out", str(target), "--data-dir", str(demo))
        data = target.read_bytes()
        assert hashlib.sha256(data).hexdigest() == letter["payload_sha256"]
        assert len(data) == int(letter["payload_size"])
        assert mode(target) == 0o600
    refused = cli("audit", "quarantine", "../worm", "--data-dir", str(demo), check=False)
    assert refused.returncode == 2 and b"not a dead-letter id" in refused.stderr
