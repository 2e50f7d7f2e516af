"""Inserts torn by a crash inside ClickHouse's own commit (embedded chDB), and their repair.

ClickHouse appends an insert's token to a table's deduplication log *before* it renames the part
into place, the raw table first, then each materialized view's target. A SIGKILL of the process
that runs chDB between the two leaves a token without a part, and the replay of that batch under
the same token is dropped. CI caught it once: a random SIGKILL of the embedded demo lost 11 token
entropy rows for good while the rollup counted them (``tests/reliability/test_embedded_crash.py``).

The kill lands in a window of a few microseconds, so these tests make each torn state on disk
instead, with the real engine: one process stores batch A and batch B (merges stopped, so B's parts
stay apart) and exits; the test removes what the crash would have lost (B's part, and where the
view had not run yet, the view's part and log line); a second process replays B under the same
token exactly as a sink does, with and without ``ClickHouseSink.repair_replay``
(``entroloop.sinks.clickhouse.torn_insert``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

STORE = r"""
import json, sys
from entroloop.collectors.synthetic_fleet import SyntheticFleet
from entroloop.contract.codec import encode
from entroloop.contract.records import TokenEntropy
from entroloop.infra.clickhouse.client import connect
from entroloop.sinks.clickhouse.writer import ClickHouseSink

def parts(client, table):
    return {r[0] for r in client.query(f"SELECT name FROM system.parts WHERE database = 'entroloop' "
                                          f"AND table = '{table}' AND active").result_rows}

records = [r for q in SyntheticFleet(seed=5).requests(40) for r in q.records if isinstance(r, TokenEntropy)]
client = connect("chdb://" + sys.argv[1])
with open(sys.argv[1] + ".records", "w") as out:  # the bus: the replay reads the very same records
    json.dump([encode(r).hex() for r in records], out)
sink = ClickHouseSink(client, "entroloop")
client.command("SYSTEM STOP MERGES")
half = len(records) // 2
sink.write(TokenEntropy.topic, 0, 0, half - 1, records[:half])
before = {t: parts(client, t) for t in ("token_entropy", "entropy_1m")}
sink.write(TokenEntropy.topic, 0, half, len(records) - 1, records[half:])
paths = {t: client.query(f"SELECT data_paths[1] FROM system.tables WHERE database = 'entroloop' AND name = '{t}'"
                         ).result_rows[0][0] for t in before}
print(json.dumps({"half": half, "total": len(records),
                  "b_parts": {t: sorted(parts(client, t) - before[t]) for t in before}, "paths": paths}))
"""

REPLAY = r"""
import json, sys
from entroloop.contract.codec import decode
from entroloop.contract.records import TokenEntropy
from entroloop.infra.clickhouse.client import connect
from entroloop.sinks.clickhouse.writer import ClickHouseSink

records = [decode(bytes.fromhex(h)) for h in json.load(open(sys.argv[1] + ".records"))]
client = connect("chdb://" + sys.argv[1])
sink = ClickHouseSink(client, "entroloop", embedded=True)  # notes the newest insert before any write
half = len(records) // 2
batch = [(0, half, len(records) - 1)]
sink.write(TokenEntropy.topic, *batch[0], records[half:])  # the replay of batch B
restored = sink.repair_replay(TokenEntropy.topic, batch, records[half:]) if sys.argv[2] == "repair" else 0
q = lambda sql: client.query(sql).result_rows[0][0]
print(json.dumps({
    "restored": restored,
    "stored": sorted(str(e) for (e,) in client.query("SELECT DISTINCT event_id FROM entroloop.token_entropy").result_rows),
    "raw_rows": q("SELECT count() FROM entroloop.token_entropy"),
    "raw_tokens": q("SELECT sum(length(entropies)) FROM entroloop.token_entropy"),
    "rollup_chunks": q("SELECT sum(chunks) FROM entroloop.entropy_1m"),
    "rollup_tokens": q("SELECT sum(tokens) FROM entroloop.entropy_1m"),
    "expected": sorted(str(r.event_id) for r in records),
}))
"""


def _run(script: str, *args: str) -> dict:
    done = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def _forget_in_log(table_path: Path, part: str) -> None:
    """Remove ``part``'s line from the table's deduplication log: the crash came before it was written."""
    for log in (table_path / "deduplication_logs").glob("deduplication_log_*.txt"):
        lines = log.read_text().splitlines(keepends=True)
        kept = [line for line in lines if f"\t{part}\t" not in line]
        if len(kept) != len(lines):
            log.write_text("".join(kept))
            return
    raise AssertionError(f"no deduplication log line names {part}")


# What each crash leaves on disk, from B's parts: (raw part lost, view part lost, view log line written)
TORN = {
    "intact": (False, False, True),  # a plain redelivery: ClickHouse's token check must decide alone
    "view not run": (False, True, False),  # raw committed, the view never started: ClickHouse completes it
    "raw torn": (True, True, False),  # raw token logged, part lost, view not run (chDB's order)
    "raw torn after the view": (True, False, True),  # the same with the view first
    "rollup torn": (False, True, True),  # raw committed, the view's token logged, its part lost
}


def _torn_store(tmp_path: Path, state: str) -> tuple[Path, dict]:
    folder = tmp_path / state.replace(" ", "_")
    stored = _run(STORE, str(folder))
    raw_lost, view_lost, view_logged = TORN[state]
    for table, lost, logged in (("token_entropy", raw_lost, True), ("entropy_1m", view_lost, view_logged)):
        (part,) = stored["b_parts"][table]
        path = Path(stored["paths"][table])
        if lost:
            shutil.rmtree(path / part)
        if not logged:
            _forget_in_log(path, part)
    return folder, stored


def _consistent(after: dict) -> list[str]:
    problems = []
    if after["stored"] != after["expected"]:
        problems.append(f"raw table holds {len(after['stored'])} of {len(after['expected'])} events")
    if after["raw_rows"] != len(after["stored"]):
        problems.append(f"{after['raw_rows']} raw rows for {len(after['stored'])} events")
    if (after["rollup_chunks"], after["rollup_tokens"]) != (after["raw_rows"], after["raw_tokens"]):
        problems.append(f"rollup counts {after['rollup_chunks']} chunks / {after['rollup_tokens']} tokens, "
                        f"raw table {after['raw_rows']} / {after['raw_tokens']}")
    return problems


@pytest.mark.parametrize("state", list(TORN))
def test_replay_with_repair_leaves_raw_table_and_rollup_whole(tmp_path: Path, state: str) -> None:
    folder, stored = _torn_store(tmp_path, state)
    after = _run(REPLAY, str(folder), "repair")
    assert not _consistent(after), f"{state}: {_consistent(after)}"
    raw_lost = TORN[state][0]
    assert after["restored"] == (stored["total"] - stored["half"] if raw_lost else 0), after


@pytest.mark.parametrize("state", ["raw torn", "raw torn after the view", "rollup torn"])
def test_without_the_repair_clickhouse_drops_the_replay_of_a_torn_insert(tmp_path: Path, state: str) -> None:
    """The torn states made here are the failure: ClickHouse's token check alone leaves them broken."""
    folder, _ = _torn_store(tmp_path, state)
    after = _run(REPLAY, str(folder), "plain")
    assert _consistent(after), f"{state}: the replay alone repaired it, so this test no longer makes a torn insert"
