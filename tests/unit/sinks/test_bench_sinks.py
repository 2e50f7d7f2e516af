"""`entroloop bench sinks` plumbing: the chDB figure runs the production path, counts every row and
reports each stage; the baseline file of an earlier run turns into ratios. No speed is asserted
(speed is what the benchmark itself reports)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import typer
from entroloop.sinks import bench

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


def test_baseline_ratio_reaches_the_report(tmp_path: Path):
    run = {"clickhouse_rows_per_s": {"token_entropy": 20_000.0, "spans": 40_000.0},
           "clickhouse_rows_per_cpu_s": {"spans": 30_000.0}}
    baseline_file = tmp_path / "old.txt"
    baseline_file.write_text("table output\n" + json.dumps(run) + "\n")
    previous = _baseline_rows_per_s(baseline_file)
    assert previous == {"token_entropy": {"end_to_end": 20_000.0},
                        "spans": {"end_to_end": 40_000.0, "end_to_end_per_cpu_s": 30_000.0}}

    stage = {"end_to_end": 50_000.0, "end_to_end_per_cpu_s": 60_000.0, "decode": 1.0, "arrow": 2.0, "insert": 3.0}
    figures = {"clickhouse_stage_rows_per_s": {"token_entropy": stage, "spans": stage},
               "clickhouse_baseline_rows_per_s": previous, "load_average": 1.5,
               "audit": {"parquet_mb_per_s": 1.0, "events": 10.0, "verify_seconds": 1.0, "verify_events_per_s": 10.0}}
    out = tmp_path / "BENCHMARKS.md"
    _write_report(figures, out)
    text = out.read_text()
    assert "2.50× the baseline build (20,000 rows/s" in text and "1.25× the baseline build (40,000 rows/s" in text
    assert "2.00× the baseline build (30,000 rows/CPU-s" in text
    assert "load average 1.5" in text and "| chDB rows per CPU-second, spans (decode + Arrow + insert) | 60,000 |" in text


def test_baseline_file_without_json_is_refused(tmp_path: Path):
    path = tmp_path / "empty.txt"
    path.write_text("no figures here\n")
    with pytest.raises(typer.BadParameter):
        _baseline_rows_per_s(path)
