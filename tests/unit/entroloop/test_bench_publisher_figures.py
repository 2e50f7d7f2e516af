"""`entroloop bench publisher`'s figures from repeated rounds: medians, spreads, the ratio to the
bare Producer measured in the same rounds, and a run that lost records says so."""

from __future__ import annotations

import pytest

from entroloop.benchmarks import publisher


def result(delivered: list[float], bare: list[float], delivered_all: bool = True) -> dict:
    rounds = {key: [1.0, 2.0, 3.0] for key in publisher.ROUND_KEYS}
    rounds["delivered_per_s"] = delivered
    rounds["bare_delivered_per_s"] = bare
    rounds["delivered_ratio"] = [d / b for d, b in zip(delivered, bare, strict=True)]
    out = {"events": 1000, "runs": 3, "delivered_all": delivered_all, "stats": {"spooled": 0}}
    out |= {key: sorted(values)[1] for key, values in rounds.items()}
    out["rounds"] = {key: {"values": values, "load_averages": [0.4, 1.2]} for key, values in rounds.items()}
    return out


def test_figures_are_medians_of_the_rounds_with_the_bare_producer_beside_them() -> None:
    figures = {f.name: f for f in publisher.figures(result([150_000, 170_000, 190_000], [160_000, 170_000, 200_000]))}
    delivered = figures["delivered to the broker"]
    assert delivered.value == 170_000 and delivered.runs == 3 and delivered.spread == "150,000–190,000"
    assert delivered.met is True and delivered.load_average == 1.2
    assert figures["bare confluent-kafka Producer, delivered"].value == 170_000
    ratio = figures["delivered: node publisher / bare Producer"]
    # the median of per-round ratios (0.9375, 1.0, 0.95), not the ratio of the medians
    assert ratio.value == pytest.approx(0.95) and ratio.spread == "0.938–1"


def test_a_run_that_lost_records_is_said_in_the_note() -> None:
    figures = {f.name: f for f in publisher.figures(result([50_000] * 3, [60_000] * 3, delivered_all=False))}
    assert figures["delivered to the broker"].met is False
    assert "NOT every record was delivered" in figures["delivered to the broker"].note
