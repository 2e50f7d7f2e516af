"""The gate's verdict and answer matching (pure logic, no torch)."""

from __future__ import annotations

import math

from entroloop.training.gate import GateConfig, answer_matches, decide

CFG = GateConfig(min_improvement=0.1, min_pass_rate=0.5, loss_tolerance=0.05)


def test_accepts_improvement_without_forgetting() -> None:
    assert decide(0.0, 0.9, 3.0, 3.1, 10, 10, CFG) == (True, [])


def test_rejects_when_suite_does_not_improve_enough() -> None:
    ok, reasons = decide(0.5, 0.55, 3.0, 3.0, 10, 10, CFG)
    assert not ok and "did not improve" in reasons[0]


def test_rejects_low_pass_rate_even_if_improved() -> None:
    ok, reasons = decide(0.0, 0.2, 3.0, 3.0, 10, 10, CFG)
    assert not ok and any("minimum" in r for r in reasons)


def test_loss_tolerance_boundary() -> None:
    assert decide(0.0, 1.0, 2.0, 2.0 * 1.05, 10, 10, CFG)[0]
    ok, reasons = decide(0.0, 1.0, 2.0, 2.0 * 1.0501, 10, 10, CFG)
    assert not ok and "regressed" in reasons[0]
    assert not decide(0.0, 1.0, 2.0, math.nan, 10, 10, CFG)[0]


def test_empty_sets_are_not_a_pass() -> None:
    assert not decide(0.0, 0.0, 3.0, 3.0, 0, 10, CFG)[0]
    assert not decide(0.0, 1.0, math.nan, math.nan, 10, 0, CFG)[0]
    assert decide(0.0, 1.0, math.nan, math.nan, 10, 0, GateConfig(require_general_set=False))[0]


def test_answer_matching() -> None:
    assert answer_matches(" Omega Seven.", "omega seven")
    assert answer_matches("omega seven psi psi", "omega seven")  # states the answer, keeps talking
    assert not answer_matches("omega sevens", "omega seven")
    assert not answer_matches("sigma two", "omega seven")
    assert not answer_matches("anything", "   ")
