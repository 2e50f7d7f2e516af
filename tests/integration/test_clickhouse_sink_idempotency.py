"""The ClickHouse sink against the real engine (chDB): redelivered batches never become rows."""

from __future__ import annotations

import subprocess
import sys

import pytest
from entroloop.collectors.synthetic_fleet import SyntheticFleet
from entroloop.sinks.clickhouse.writer import ClickHouseSink

from entroloop.contract.records import TokenEntropy


@pytest.fixture(scope="module")
def sink(chdb_client):
    return ClickHouseSink(chdb_client, "sink_idempotency")


def raw_count(sink: ClickHouseSink, table: str) -> int:
    return sink.client.query(f"SELECT count() FROM {sink.database}.{table}").result_rows[0][0]


def token_records(n: int, seed: int) -> list[TokenEntropy]:
    return [r for q in SyntheticFleet(seed=seed).requests(n) for r in q.records if isinstance(r, TokenEntropy)]


def test_same_batch_twice_is_stored_once(sink):
    records = token_records(50, seed=1)
    sink.write(TokenEntropy.topic, 0, 0, len(records) - 1, records)
    sink.write(TokenEntropy.topic, 0, 0, len(records) - 1, records)
    assert raw_count(sink, "token_entropy") == len(records)


def test_differently_cut_redelivery_collapses_on_event_id(sink):
    records = token_records(40, seed=2)
    sink.write(TokenEntropy.topic, 1, 0, 39, records)
    sink.write(TokenEntropy.topic, 1, 10, 39, records[10:])  # another cut: slips past block dedup
    distinct = sink.client.query(f"SELECT uniqExact(event_id) FROM {sink.database}.token_entropy").result_rows[0][0]
    assert sink.count("token_entropy") == distinct


def test_entropies_and_derived_columns_are_queryable(sink):
    records = token_records(5, seed=3)
    sink.write(TokenEntropy.topic, 2, 0, 4, records)
    r = records[0]
    row = sink.client.query(
        f"SELECT n_tokens, mean_entropy, length(entropies) FROM {sink.database}.token_entropy "
        "WHERE event_id = {id:UUID}",
        parameters={"id": r.event_id},
    ).result_rows[0]
    assert row[0] == row[2] == r.n_tokens
    assert abs(row[1] - float(r.values().astype("float32").mean())) < 1e-3


def test_second_process_gets_a_clear_lock_error(tmp_path):
    """Two processes on one embedded folder: the second is told who holds it, not a stack trace."""
    folder = tmp_path / "ch"
    hold = (
        "import sys, time\nfrom entroloop.infra.clickhouse.client import connect\n"
        f"client = connect('chdb://{folder}')\nclient.command('SELECT 1')\nprint('ready', flush=True)\ntime.sleep(60)\n"
    )
    holder = subprocess.Popen([sys.executable, "-c", hold], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "ready"
        probe = (
            "from entroloop.infra.clickhouse.client import connect, ClickHouseLocked\n"
            f"try:\n    connect('chdb://{folder}').command('SELECT 1')\n"
            "except ClickHouseLocked as e:\n    print('LOCKED', e)\n"
        )
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    finally:
        holder.kill()
    assert "LOCKED" in out.stdout and "is in use by process" in out.stdout, out.stdout + out.stderr[-2000:]
