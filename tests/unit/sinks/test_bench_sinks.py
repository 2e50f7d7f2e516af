"""`entroloop bench sinks` plumbing: the chDB figure runs the production path, counts every row and
reports each stage; the baseline file of an earlier run turns into ratios. No speed is asserted
(speed is what the benchmark itself reports)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from entroloop.sinks import bench

from entroloop.benchmarks import sinks as repeated_bench
from entroloop.benchmarks.repeats import Repeated
from entroloop.cli.bench_sinks import _baseline_rows_per_s, _write_report


def test_clickhouse_figure_has_every_stage_and_stores_every_row(chdb_client, ch_database):
    figures = bench.clickhouse_rows_per_s(rows=1_500, batch_rows=600, client=chdb_client, database=ch_database)
    assert set(figures) == {"token_entropy", "spans"}
    for name, by_stage in figures.items():
        assert set(by_stage) == {"end_to_end", "end_to_end_per_cpu_s", *bench.CLICKHOUSE_STAGES}
        assert all(v > 0 for v in by_stage.values())
        # the stages run one after the other, so the whole is slower than its slowest stage
        assert by_stage["end_to_end"] <= min(by_stage[s] for s in bench.CLICKHOUSE_STAGES)
        # three inserts (600 + 600 + 300 rows), each stored once
        count = chdb_client.query(f"SELECT count() FROM {ch_database}.{name}").result_rows[0][0]
        assert count == 1_500


def test_repeated_runs_each_measure_in_a_database_dropped_after_it(chdb_client):
    said: list[str] = []
    stages = repeated_bench.clickhouse_repeated(rows=400, batch_rows=300, runs=2, progress=said.append, client=chdb_client)
    assert set(stages) == {"token_entropy", "spans"}
    for by_stage in stages.values():
        assert set(by_stage) == {"end_to_end", "end_to_end_per_cpu_s", *bench.CLICKHOUSE_STAGES}
        assert all(m.runs == 2 and m.low > 0 for m in by_stage.values())
    assert said == ["chDB inserts (decode + Arrow + insert), run 1/2", "chDB inserts (decode + Arrow + insert), run 2/2"]
    # each run had a fresh database (its count check would fail on a second run into the same
    # tables) and left nothing behind
    databases = {row[0] for row in chdb_client.query("SHOW DATABASES").result_rows}
    assert not {"bench_run_1", "bench_run_2"} & databases


def test_repeated_audit_runs_give_every_figure_per_run():
    audit = repeated_bench.audit_repeated(events=300, runs=2)
    assert {"parquet_mb_per_s", "verify_seconds", "verify_events_per_s", "events"} <= set(audit)
    assert audit["events"].values == (300.0, 300.0)
    assert all(v > 0 for v in audit["verify_events_per_s"].values)
    assert audit["reopen_ids"].values == (300.0, 300.0)  # a restarted writer read back every id of the log


def _runs(*values: float) -> Repeated:
    return Repeated(tuple(values), (1.2, 1.5))


def test_baseline_ratio_reaches_the_report(tmp_path: Path):
    run = {"clickhouse_rows_per_s": {"token_entropy": 20_000.0, "spans": 40_000.0},
           "clickhouse_rows_per_cpu_s": {"spans": 30_000.0}}
    baseline_file = tmp_path / "old.txt"
    baseline_file.write_text("table output\n" + json.dumps(run) + "\n")
    previous = _baseline_rows_per_s(baseline_file)
    assert previous == {"token_entropy": {"end_to_end": 20_000.0},
                        "spans": {"end_to_end": 40_000.0, "end_to_end_per_cpu_s": 30_000.0}}

    stage = {"end_to_end": _runs(40_000.0, 50_000.0, 70_000.0), "end_to_end_per_cpu_s": _runs(60_000.0),
             "decode": _runs(1.0), "arrow": _runs(2.0), "insert": _runs(3.0)}
    audit = {"parquet_mb_per_s": _runs(1.0), "events": _runs(10.0), "verify_seconds": _runs(1.0),
             "verify_events_per_s": _runs(10.0), "reopen_seconds": _runs(0.25), "reopen_ids": _runs(300.0)}
    out = tmp_path / "BENCHMARKS.md"
    _write_report({"token_entropy": stage, "spans": stage}, audit, previous, out)
    text = out.read_text()
    # the median of the runs is the figure, compared with the baseline
    assert "2.50× the baseline build (20,000 rows/s" in text and "1.25× the baseline build (40,000 rows/s" in text
    assert "2.00× the baseline build (30,000 rows/CPU-s" in text
    assert "| chDB rows/s per sink process, spans (decode + Arrow + insert) | 50,000 | rows/s | 3 (40,000–70,000) | 1.5 |" in text
    assert "| chDB rows per CPU-second, spans (decode + Arrow + insert) | 60,000 |" in text
    assert "| audit writer restart: open the 6 audit chains of that log | 0.25 | s |" in text
    assert "(300 ids)" in text


def test_baseline_file_without_json_is_refused(tmp_path: Path):
    path = tmp_path / "empty.txt"
    path.write_text("no figures here\n")
    with pytest.raises(typer.BadParameter):
        _baseline_rows_per_s(path)
