"""`entroloop query` reads entroloop's tables only: no files, URLs, other servers or writes.

Issue 12, finding 2: the command used to hand any SQL to chDB, so `file('DATA/worm/audit/...')`
searched every audited answer, `file('/etc/passwd')` read the host and `INSERT INTO FUNCTION file`
wrote files. The refusals below run against a real chDB; the documented dashboard queries must
still run through the same guard.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from entroloop.sinks.clickhouse.writer import ClickHouseSink

from entroloop.infra.clickhouse.readonly import QueryRefused, run_readonly_query
from tests.unit.sinks.sink_records import sample_records

DICTIONARY = Path(__file__).resolve().parents[3] / "docs" / "data-dictionary.md"


@pytest.fixture(scope="module")
def db(chdb_client) -> str:
    """A migrated database with sample rows (module-wide: migrating costs seconds)."""
    import uuid

    name = f"q_{uuid.uuid4().hex[:10]}"
    sink = ClickHouseSink(chdb_client, name)
    for topic, records in sample_records(60, seed=7).items():
        sink.write(topic, 0, 0, len(records) - 1, records)
    return name


@pytest.fixture
def client(chdb_client, db):
    yield chdb_client
    chdb_client.database = None  # the session client is shared; leave its current database as found
    chdb_client.command("USE default")


@pytest.fixture
def secret_file(tmp_path: Path) -> Path:
    path = tmp_path / "answers.csv"
    path.write_text("订单 12345 的回答\n")
    return path


def refused(client, db: str, sql: str) -> str:
    with pytest.raises(QueryRefused) as info:
        run_readonly_query(client, sql, db)
    return str(info.value)


def test_reading_files_is_refused(client, db, secret_file, tmp_path):
    (tmp_path / "audit").mkdir()
    for sql in (
        f"SELECT * FROM file('{secret_file}', CSV)",
        f"SELECT * FROM file('{tmp_path}/audit/*.parquet', Parquet) WHERE prompt LIKE '%订单%'",
        "SELECT * FROM file('/etc/passwd', LineAsString)",
        "SELECT file('/etc/passwd')",  # the scalar file(): readonly=1 alone lets this through in chDB
        f"SELECT count() FROM {db}.audit_index WHERE length(file('/etc/passwd')) > 0",
        "DESCRIBE file('/etc/passwd')",
        "EXPLAIN SELECT * FROM file('/etc/passwd', LineAsString)",
        f"SELECT * FROM {db}.audit_index WHERE request_id IN (SELECT * FROM file('/etc/passwd', LineAsString))",
    ):
        assert "not allowed" in refused(client, db, sql), sql


def test_urls_object_stores_and_other_servers_are_refused(client, db):
    for sql in (
        "SELECT * FROM url('http://127.0.0.1:9/x', CSV)",
        "SELECT * FROM s3('http://127.0.0.1:9/bucket/*.parquet', Parquet)",
        "SELECT * FROM s3Cluster('c', 'http://127.0.0.1:9/b/x', Parquet)",
        "SELECT * FROM remote('127.0.0.1:9', system.one)",
        "SELECT * FROM remoteSecure('127.0.0.1:9', system.one)",
        "SELECT * FROM mysql('127.0.0.1:9', 'd', 't', 'u', 'p')",
        "SELECT * FROM postgresql('127.0.0.1:9', 'd', 't', 'u', 'p')",
        "SELECT * FROM hdfs('hdfs://127.0.0.1:9/x', CSV)",
        "SELECT * FROM executable('cat /etc/passwd', LineAsString)",
        "SELECT * FROM merge('system', '.*')",
        "SELECT dictGet('d', 'a', toUInt64(1))",
        "SELECT * FROM dictionary('d')",
    ):
        assert "not allowed" in refused(client, db, sql), sql


def test_writes_are_refused(client, db, tmp_path):
    out = tmp_path / "out.csv"
    for sql in (
        f"INSERT INTO FUNCTION file('{out}', CSV) SELECT 1",
        f"SELECT 1 INTO OUTFILE '{out}'",  # chDB writes it even with readonly=1
        f"INSERT INTO {db}.dead_letters (reason) VALUES ('x')",
        f"DROP TABLE {db}.audit_index",
        f"ALTER TABLE {db}.bad_cases DELETE WHERE 1",
        "CREATE TABLE default.x (a String) ENGINE = File(CSV)",
        "SYSTEM DROP DNS CACHE",
    ):
        refused(client, db, sql)
    assert not out.exists()


def test_text_holding_system_tables_are_refused(client, db):
    for sql in ("SELECT query FROM system.query_log", "SELECT * FROM system.processes", "SHOW PROCESSLIST",
                "SELECT 1 WHERE 'x' IN system.query_log", "SELECT * FROM system.errors"):
        assert refused(client, db, sql), sql  # refused, with a reason the user can read


def test_settings_cannot_lift_readonly(client, db):
    assert refused(client, db, f"SELECT count() FROM {db}.audit_index SETTINGS readonly = 0")


def test_ordinary_queries_still_work(client, db):
    assert run_readonly_query(client, f"SELECT count() FROM {db}.audit_index FINAL", db).result_rows[0][0] > 0
    assert run_readonly_query(client, "SELECT count() FROM audit_index", db).result_rows[0][0] > 0  # current db
    names = {r[0] for r in run_readonly_query(client, f"SHOW TABLES FROM {db}", db).result_rows}
    assert "dead_letters" in names
    assert run_readonly_query(client, f"DESCRIBE TABLE {db}.bad_cases", db).result_rows
    assert run_readonly_query(client, f"EXPLAIN SELECT 1 FROM {db}.spans", db).result_rows
    assert run_readonly_query(client, "SELECT name FROM system.tables WHERE database = currentDatabase()", db).result_rows
    assert run_readonly_query(client, "WITH x AS (SELECT 1 AS a) SELECT a FROM x", db).result_rows == [(1,)]
    assert run_readonly_query(client, "SELECT number FROM numbers(3)", db).result_rows == [(0,), (1,), (2,)]


@pytest.mark.parametrize("sql", re.findall(r"```sql\n(.*?)```", DICTIONARY.read_text(), flags=re.DOTALL),
                         ids=lambda s: " ".join(s.split())[:50])
def test_every_documented_query_passes_the_guard(client, db, sql):
    result = run_readonly_query(client, sql.replace("entroloop.", f"{db}."), db)
    assert isinstance(result.result_rows, list), sql  # it ran: a refusal or an SQL error raises instead


def test_the_cli_refuses_with_exit_2_and_says_why(tmp_path):
    """The command itself (own process: chDB opens one folder per process)."""
    subprocess.run([sys.executable, "-m", "entroloop.cli", "migrate", "--create", "--data-dir", str(tmp_path / "data")],
                   check=True, capture_output=True, timeout=120)
    cmd = [sys.executable, "-m", "entroloop.cli", "query", "SELECT * FROM file('/etc/passwd', LineAsString)",
           "--data-dir", str(tmp_path / "data")]
    done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stderr
    assert "query refused" in done.stderr and "file() is not allowed" in done.stderr
    assert "root:" not in done.stdout
