"""`entroloop bench all` goes on past a benchmark that cannot run, and `bench lag` without a broker
says so in the report instead of failing."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from entroloop.benchmarks import lag
from entroloop.benchmarks.report import Figure, write_benchmarks
from entroloop.cli import app, bench


def test_bench_all_reports_a_benchmark_that_cannot_run_and_runs_the_rest(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "BENCHMARKS.md"
    ran: list[str] = []

    def needs_ml(out: Path) -> None:
        raise typer.Exit(2)

    def crashes(out: Path) -> None:
        raise RuntimeError("boom")

    def works(out: Path) -> None:
        ran.append("works")
        write_benchmarks([Figure("works", "speed", 3.0, "x/s")], out)

    def writes_nothing(out: Path) -> None:
        ran.append("writes_nothing")

    # an earlier run measured "needs_ml" and a benchmark that no longer exists: bench all drops both
    write_benchmarks([Figure("needs_ml", "ratio", 0.98, "×", note="CPU"), Figure("gone", "speed", 1.0, "x/s")], out)
    monkeypatch.setattr(bench, "BENCHMARKS", {"needs_ml": needs_ml, "crashes": crashes, "works": works,
                                              "writes_nothing": writes_nothing})
    bench.run_all(out=out)
    assert ran == ["works", "writes_nothing"]
    data = json.loads(out.with_suffix(".json").read_text())
    assert data["works"][0]["value"] == 3.0
    assert [f["value"] for f in data["needs_ml"]] == [None] and "exited with 2" in data["needs_ml"][0]["note"]
    assert data["crashes"][0]["value"] is None and "RuntimeError: boom" in data["crashes"][0]["note"]
    assert data["writes_nothing"][0]["value"] is None and "wrote no figures" in data["writes_nothing"][0]["note"]
    assert "gone" not in data
    text = out.read_text()
    assert "## crashes" in text and "not measured in this run" in text and "0.98" not in text and "## gone" not in text


def test_bench_all_interrupted_leaves_the_old_report_whole(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "BENCHMARKS.md"
    write_benchmarks([Figure("old", "speed", 2.0, "x/s")], out)
    before = out.read_text()

    def interrupted(out: Path) -> None:
        write_benchmarks([Figure("first", "speed", 1.0, "x/s")], out)
        raise KeyboardInterrupt

    monkeypatch.setattr(bench, "BENCHMARKS", {"first": interrupted})
    try:
        bench.run_all(out=out)
    except KeyboardInterrupt:
        pass
    assert out.read_text() == before


def test_each_section_says_when_it_was_measured(tmp_path: Path, monkeypatch) -> None:
    out = tmp_path / "BENCHMARKS.md"
    write_benchmarks([Figure("early", "speed", 2.0, "x/s")], out)
    data = json.loads(out.with_suffix(".json").read_text())
    data["_measured"]["early"] = {"date": "2026-01-02", "machine": "another box"}
    out.with_suffix(".json").write_text(json.dumps(data))
    write_benchmarks([Figure("late", "speed", 1.0, "x/s")], out)
    text = out.read_text()
    early = text[text.index("## early"):text.index("## late")]
    assert "Measured 2026-01-02 on another box." in early
    assert "Measured 2026-01-02" not in text[text.index("## late"):]


def test_every_benchmark_takes_out_as_a_keyword() -> None:
    import inspect

    for name, command in bench.BENCHMARKS.items():
        assert "out" in inspect.signature(command).parameters, name
    assert {"detectors", "sinks", "collector", "publisher", "lag"} <= set(bench.BENCHMARKS)


def test_bench_lag_without_a_broker_says_so_in_the_report(tmp_path: Path) -> None:
    out = tmp_path / "BENCHMARKS.md"
    result = CliRunner().invoke(app, ["bench", "lag", "--broker", "127.0.0.1:1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "not reachable" in " ".join(result.output.split())
    row = json.loads(out.with_suffix(".json").read_text())["lag"][0]
    assert row["value"] is None and "not measured" in row["note"] and "not reachable" in row["note"]


def test_lag_figures_state_the_rate_and_judge_the_target() -> None:
    result = {"rate": 5000, "seconds": 60, "requests": 300000, "events_sent": 950000, "events_stored": 950000,
              "achieved_requests_per_s": 4990.0, "events_per_s": 15800.0, "batch_seconds": 1.0, "partitions": 6,
              "p50_s": 0.8, "p95_s": 1.5, "p99_s": 1.9, "max_s": 2.5}
    figures = {f.name: f for f in lag.figures(result)}
    assert figures["emit -> queryable lag p99"].met is True
    assert figures["sustained request rate"].met is True
    slow = {**result, "rate": 2000, "achieved_requests_per_s": 2000.0}
    assert {f.name: f for f in lag.figures(slow)}["emit -> queryable lag p99"].met is False  # below the target rate
