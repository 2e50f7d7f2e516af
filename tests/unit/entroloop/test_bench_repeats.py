"""Repeated benchmark figures: median, spread and load average reach BENCHMARKS.md."""

from __future__ import annotations

import itertools

import pytest

from entroloop.benchmarks.repeats import Repeated, repeat, repeat_many
from entroloop.benchmarks.report import Figure, cpu_name, write_benchmarks


def test_repeat_keeps_every_run_and_reports_the_median():
    values = iter([30.0, 10.0, 20.0])
    measured = repeat(lambda: next(values), runs=3)
    assert measured.values == (30.0, 10.0, 20.0)
    assert measured.median == 20.0
    assert measured.spread() == "10–30"
    assert len(measured.load_averages) == 6


def test_repeat_many_measures_quantities_together_per_run():
    counter = itertools.count(1)

    def run():
        n = next(counter)
        return {"baseline": 10.0 * n, "candidate": 5.0 * n}

    measured = repeat_many(run, runs=3)
    assert measured["baseline"].values == (10.0, 20.0, 30.0)
    assert measured["candidate"].median == 10.0


def test_one_run_has_no_spread_and_zero_runs_is_refused():
    assert Repeated((5.0,), (0.1, 0.2)).spread() == ""
    with pytest.raises(ValueError):
        repeat(lambda: 1.0, runs=0)


def test_benchmarks_md_shows_runs_spread_and_load(tmp_path):
    measured = Repeated((1200.0, 1000.0, 1100.0), (0.5, 1.7))
    out = write_benchmarks([Figure.repeated("demo", "events/s", measured, "events/s", target=">= 1,000", met=True)],
                           tmp_path / "BENCHMARKS.md")
    text = out.read_text()
    assert "| events/s | 1,100 | events/s | 3 (1,000–1,200) | 1.7 | >= 1,000 | yes |" in text
    # figures stored before these columns existed still render
    write_benchmarks([Figure("old", "rows/s", 5.0, "rows/s")], out)
    assert "| rows/s | 5 | rows/s | 1 |  |" in out.read_text()


def test_the_machine_names_the_cpu_family_so_hosts_of_one_brand_line_differ():
    # Two hypervisor hosts that both say "AMD EPYC": figures from one do not compare with the other's.
    def cpuinfo(family: int, model: int) -> str:
        first = f"processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: {family}\nmodel\t\t: {model}\nmodel name\t: AMD EPYC\n"
        return first + "\nprocessor\t: 1\ncpu family\t: 99\nmodel\t\t: 99\nmodel name\t: other\n"

    assert cpu_name(cpuinfo(26, 2)) == "AMD EPYC (family 26, model 2)"
    assert cpu_name(cpuinfo(25, 1)) != cpu_name(cpuinfo(26, 2))
    assert cpu_name("model name\t: Some CPU\n") == "Some CPU"
    assert cpu_name("processor\t: 0\n") is None
