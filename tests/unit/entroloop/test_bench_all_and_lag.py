"""`entroloop bench all` goes on past a benchmark that cannot run, and `bench lag` without a broker
says so in the report instead of failing."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from entroloop.benchmarks import lag
from entroloop.benchmarks.repeats import Repeated
from entroloop.benchmarks.report import Figure, write_benchmarks
from entroloop.cli import app, bench


def test_bench_all_reports_a_benchmark_that_cannot_run_and_runs_the_rest(tmp_path: Path, monkeypatch, capsys) -> None:
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
    bench.run_all(out=out, as_json=True)
    assert ran == ["works", "writes_nothing"]
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary == {"out": str(out), "measured": ["works"], "not_measured": ["needs_ml", "crashes", "writes_nothing"]}
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


def _repeated(*values: float) -> Repeated:
    return Repeated(tuple(values), (0.5, 0.7))


def _queryable(p99: tuple[float, ...], rate: float, lost: float = 0) -> dict[str, Repeated]:
    return {"p50_s": _repeated(0.4, 0.5, 0.6), "p95_s": _repeated(0.7, 0.8, 0.9), "p99_s": _repeated(*p99),
            "max_s": _repeated(1.0, 1.2, 1.5), "lost": _repeated(0, lost, 0),
            "achieved_requests_per_s": _repeated(rate, rate, rate), "events_per_s": _repeated(3.2 * rate, 3.2 * rate, 3.2 * rate),
            "inserts_per_table_s": _repeated(1.0, 1.1, 1.0)}


def test_lag_figures_judge_each_rate_against_its_target_and_carry_the_runs() -> None:
    result = {
        "runs": 3, "seconds": 15, "partitions": 6, "batch_seconds": 1.0, "baseline": "",
        "queryable": {2000.0: _queryable((0.8, 0.9, 1.4), 2000), 5000.0: _queryable((2.2, 2.5, 2.6), 5000, lost=3)},
        "alerts": {"alert_p50_s": _repeated(0.5, 0.6, 0.7), "alert_p99_s": _repeated(1.5, 3.0, 3.5),
                   "action_p50_s": _repeated(0.6, 0.7, 0.8), "action_p99_s": _repeated(1.8, 3.1, 3.6),
                   "alerts": _repeated(10, 11, 12), "actions": _repeated(5, 6, 7),
                   "achieved_requests_per_s": _repeated(2000, 2000, 2000)},
        "details": {},
    }
    figures = {f.name: f for f in lag.figures(result)}
    p99 = figures["emit -> queryable lag p99 at 2,000 req/s"]
    assert (p99.value, p99.met, p99.runs, p99.spread, p99.load_average) == (0.9, True, 3, "0.8–1.4", 0.7)
    assert figures["emit -> queryable lag p99 at 5,000 req/s"].met is False  # 2.5 s over its 2 s target
    assert figures["events lost at 2,000 req/s"].met is True
    assert figures["events lost at 5,000 req/s"].met is False  # one run lost events: the median hides it, met does not
    assert figures["emit -> alert in Kafka p99 at 2,000 req/s"].met is False
    summary = lag.summary(result)
    assert summary["p99_s"] == 0.9 and summary["p99_s@5000"] == 2.5
    assert (summary["alert_p50_s"], summary["alert_p99_s"], summary["action_p99_s"]) == (0.6, 3.0, 3.1)


def test_bench_lag_refuses_bad_rates_and_a_baseline_that_is_no_checkout(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["bench", "lag", "--rates", "fast", "--out", str(tmp_path / "B.md")])
    assert result.exit_code != 0 and "--rates" in result.output
    result = CliRunner().invoke(app, ["bench", "lag", "--baseline-checkout", str(tmp_path), "--out", str(tmp_path / "B.md")])
    text = " ".join(result.output.replace("│", " ").split())  # rich wraps the message in a box
    assert result.exit_code != 0 and "not an entroloop checkout" in text
    result = CliRunner().invoke(app, ["bench", "lag", "--baseline-of", "gateway", "--out", str(tmp_path / "B.md")])
    text = " ".join(result.output.replace("│", " ").split())
    assert result.exit_code != 0 and "sink, actions" in text


def test_lag_figures_put_the_action_runner_before_and_after_side_by_side() -> None:
    alerts = {"alert_p50_s": _repeated(0.3, 0.3, 0.4), "alert_p99_s": _repeated(0.7, 0.8, 0.9),
              "action_p50_s": _repeated(0.4, 0.5, 0.5), "action_p99_s": _repeated(1.0, 1.2, 2.5),
              "alerts": _repeated(10, 11, 12), "actions": _repeated(5, 6, 7),
              "before_action_p50_s": _repeated(7.0, 8.0, 9.0), "before_action_p99_s": _repeated(15.0, 16.0, 18.0),
              "before_alert_p99_s": _repeated(0.7, 0.9, 1.0), "before_actions": _repeated(5, 6, 7),
              "action_p99_before_over_after": _repeated(15.0, 13.3, 7.2)}
    result = {"runs": 3, "seconds": 15, "partitions": 6, "batch_seconds": 0.5, "baseline": "abc1234",
              "queryable": {}, "alerts": alerts, "details": {}}
    figures = {f.name: f for f in lag.figures(result)}
    after = figures["emit -> action executed p99 at 2,000 req/s"]
    assert (after.value, after.met, after.spread) == (1.2, True, "1–2.5")
    before = figures["before: emit -> action executed p99 at 2,000 req/s"]
    assert before.value == 16.0 and "abc1234" in before.note
    assert figures["emit -> action executed p99, before / after, at 2,000 req/s"].value == 13.3
    no_baseline = {f.name for f in lag.figures({**result, "alerts": {k: v for k, v in alerts.items()
                                                                       if not k.startswith(("before_", "action_p99_before"))}})}
    assert not any(name.startswith("before:") or "before / after" in name for name in no_baseline)


def test_a_bench_refuses_an_unreadable_figures_file_before_it_measures(tmp_path: Path) -> None:
    # every section lives in BENCHMARKS.json: a bench that merged into a broken one failed with a raw
    # JSONDecodeError after minutes of measuring; it now names the file and the fix, and exits first
    out = tmp_path / "B.md"
    out.with_suffix(".json").write_text("{not json")
    for name in ("workers", "detectors"):
        result = CliRunner().invoke(app, ["bench", name, "--broker" if name == "workers" else "--requests",
                                          "127.0.0.1:1" if name == "workers" else "100", "--out", str(out)])
        said = " ".join(result.output.split())  # rich wraps the message
        assert result.exit_code == 2, said
        assert "B.json is not valid JSON" in said and "git checkout" in said
    assert out.with_suffix(".json").read_text() == "{not json"  # left as it was
    assert not out.exists()
    out.with_suffix(".json").write_text("[]")
    said = CliRunner().invoke(app, ["bench", "workers", "--broker", "127.0.0.1:1", "--out", str(out)]).output
    assert "holds a list" in " ".join(said.split())
