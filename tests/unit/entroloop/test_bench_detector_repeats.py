"""`entroloop bench detectors` times every fleet processor several times (a fresh one each run): its
speed figures are medians with their spread and load, like every other section's (issue 16, item 5),
and the precision / recall it reports do not depend on which run they came from."""

from __future__ import annotations

from entroloop.collectors.synthetic_fleet import SyntheticFleet
from entroloop.streams.entropy_anomaly import EntropyAnomalyDetector

from entroloop.benchmarks.detectors import _timed, figures, run
from entroloop.benchmarks.repeats import Repeated
from entroloop.contract.codec import encode
from entroloop.contract.records import TokenEntropy
from entroloop.contract.settings import Settings


def test_every_fleet_speed_is_the_median_of_its_runs_with_the_spread() -> None:
    results = run(requests=120, with_intent=False, runs=3)
    speeds = {f.name: f for f in figures(results) if f.name.endswith("events/s (1 core)")}
    assert {"repetition_loop events/s (1 core)", "bad_cases events/s (1 core)",
            "fallback_rates events/s (1 core)"} <= set(speeds)
    for name, figure in speeds.items():
        assert figure.runs == 3 and "–" in figure.spread and figure.load_average is not None, name
        low, high = (float(v.replace(",", "")) for v in figure.spread.split("–"))
        assert low <= figure.value <= high, name
    loop = results["repetition_loop"]
    assert isinstance(loop["events_per_s_runs"], Repeated) and loop["events_per_s"] == round(loop["events_per_s_runs"].median)
    assert "static rules alone in the same runs" in loop["baseline"]


def test_each_run_starts_from_a_fresh_processor_so_every_run_sees_the_same_work() -> None:
    records = [r for q in SyntheticFleet(seed=5).requests(60) for r in q.records if isinstance(r, TokenEntropy)]
    settings = Settings()
    made: list[EntropyAnomalyDetector] = []

    def fresh() -> EntropyAnomalyDetector:
        made.append(EntropyAnomalyDetector.from_settings(settings))
        return made[-1]

    out, measured = _timed(fresh, records, 2, settings)
    assert len(made) == 2 and made[0] is not made[1] and measured["rate"].runs == 2
    again, _ = _timed(lambda: EntropyAnomalyDetector.from_settings(settings), records, 1, settings)
    assert [encode(r) for r in out] == [encode(r) for r in again]  # the first run's alerts, whatever the runs
    assert out and measured["ratio"].runs == 2  # the static baseline timed in the same runs
