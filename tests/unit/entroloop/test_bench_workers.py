"""`entroloop bench workers`: registered like the other benches, says so without a broker, and its
figures take the ratio per run and judge the targets on the medians."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from entroloop.benchmarks import workers
from entroloop.benchmarks.repeats import Repeated
from entroloop.cli import app, bench


def test_bench_workers_is_a_benchmark_and_without_a_broker_says_so(tmp_path: Path) -> None:
    assert "workers" in bench.BENCHMARKS
    out = tmp_path / "BENCHMARKS.md"
    result = CliRunner().invoke(app, ["bench", "workers", "--broker", "127.0.0.1:1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    row = json.loads(out.with_suffix(".json").read_text())["workers"][0]
    assert row["value"] is None and "not reachable" in row["note"]


def test_figures_report_medians_spreads_and_the_targets() -> None:
    def rep(*values: float) -> Repeated:
        return Repeated(values, (0.5, 1.5))

    result = {"requests": 40_000, "events": 87_000, "partitions": 6, "repeated": {
        "faust_events_per_s": rep(21_000, 25_000, 19_000), "plain_events_per_s": rep(40_000, 42_000, 30_000),
        "ratio": rep(0.525, 0.595, 0.633), "faust_cpu_us_per_event": rep(50, 60, 55),
        "plain_cpu_us_per_event": rep(30, 31, 29), "cpu_ratio": rep(1.7, 1.9, 1.8), "faust_cores": rep(1, 1, 1),
        "faust_changelog_records": rep(40_000, 40_000, 40_000), "faust_changelog_bytes": rep(9e6, 1.1e7, 1e7),
        "transport_events_per_s": rep(30_000, 31_000, 29_000), "transport_cpu_us_per_event": rep(33, 32, 34),
        "processors_cpu_us_per_event": rep(17, 28, 21)}}
    figures = {f.name: f for f in workers.figures(result)}
    faust = figures["Faust worker (`entroloop worker`)"]
    assert faust.value == 21_000 and faust.met is True and faust.runs == 3 and faust.load_average == 1.5
    assert faust.spread == "19,000–25,000"
    ratio = figures["Faust / plain throughput"]
    assert ratio.value == 0.595 and ratio.met is True  # the median of the per-run ratios
    transport = figures["Faust worker, processors doing nothing (its transport alone)"]
    assert transport.value == 30_000 and transport.target in (None, "")  # a diagnosis, not a target
    assert figures["processors' CPU per event in the Faust worker"].value == 21
    assert figures["Faust table changelog bytes"].value == 1e7 and figures["Faust table changelog bytes"].runs == 3
    result["repeated"]["ratio"] = rep(0.2, 0.3, 0.4)
    assert {f.name: f for f in workers.figures(result)}["Faust / plain throughput"].met is False


def test_the_faust_variant_starts_the_worker_with_options_the_cli_accepts() -> None:
    # --help after the options: the parser rejects an unknown option before it shows the help
    result = CliRunner().invoke(app, [*workers.FAUST_WORKER_ARGS, "--help"])
    assert result.exit_code == 0, result.output
    assert CliRunner().invoke(app, ["worker", "--loglevel", "warn", "--help"]).exit_code != 0  # the test can fail



def test_the_transport_variant_runs_the_worker_command_with_processors_that_do_nothing(monkeypatch) -> None:
    import sys

    from entroloop.streams import defaults

    from entroloop import cli
    from entroloop.contract.codec import decode
    from entroloop.contract.settings import Settings

    started: dict[str, object] = {}

    def fake_cli() -> None:  # what the worker does first: build its processors from the factory
        started["argv"] = list(sys.argv)
        started["processors"] = defaults.default_processors(Settings())

    monkeypatch.setattr(cli, "main", fake_cli)
    monkeypatch.setattr(defaults, "default_processors", defaults.default_processors)  # restored afterwards
    monkeypatch.setattr(sys, "argv", ["entroloop.benchmarks.workers", "--faust-transport"])
    workers.main()
    assert started["argv"][1:] == list(workers.FAUST_WORKER_ARGS)
    processors = started["processors"]
    assert {"entropy_anomaly", "bad_cases", "fallback_rates"} <= {p.name for p in processors}
    events = [decode(value) for _, _, value in workers.fleet_payloads(300)]
    for processor in processors:  # the same inputs as the real worker's, and nothing comes out
        fed = [e for e in events if isinstance(e, processor.inputs)]
        assert fed, processor.name
        assert processor.process_batch(fed) == [] and processor.on_watermark(2e9) == []


def test_the_work_ends_where_the_process_stopped_being_busy_not_at_its_last_idle_tick() -> None:
    # 20 ms samples of /proc's 10 ms ticks: a core's worth for 2 s, then an idle worker's
    # housekeeping, one tick every 200 ms, until the final commit a second later
    samples, cpu = [], 0.0
    for step in range(151):
        t = step * 0.02
        if t <= 2.0:
            cpu = round(t / 0.01) * 0.01
        elif step % 10 == 0:
            cpu += 0.01
        samples.append((t, cpu))
    end, end_cpu = workers.end_of_work(samples)
    # a window still busy for its first 30 ms ends up to 70 ms late: the figure's resolution
    assert 1.95 <= end <= 2.0 + 0.1 * (1 - workers.BUSY_CORES) and abs(end_cpu - 2.0) <= 0.02
    # one tick in one 20 ms sample is half a core: judged sample by sample, the idle second was work
    assert workers.end_of_work(samples, window_s=0.0)[0] >= 2.9
    assert workers.end_of_work([(0.0, 0.0), (1.0, 0.0)]) == (1.0, 0.0)  # never busy: the last sample
