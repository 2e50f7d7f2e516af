"""Data set builder: corrections + replay, de-duplication, deterministic split, digest."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from entroloop.training.dataset import (
    CORRECTION,
    REPLAY,
    TrainingData,
    build_dataset,
    normalize_text,
)

from .training_records import audit, bad_case, feedback


def _inputs():
    cases = [bad_case(f"question {i}", f"answer {i}", at=1000.0 + i) for i in range(10)]
    cases.append(bad_case("Question  0 ", "better answer 0", at=2000.0))  # same prompt, corrected later
    audits = [audit(f"traffic {i}", f"reply {i}", f"req-{i}") for i in range(30)]
    audits.append(audit("question 3", "wrong", "req-bad-prompt"))  # a corrected prompt: never replayed
    fb = [feedback("req-0", -1), feedback("req-1", 1)]  # req-0 was disliked (thumbs down), req-1 liked
    return cases, audits, fb


def test_corrections_deduplicated_latest_wins_and_replay_excludes_bad_traffic() -> None:
    cases, audits, fb = _inputs()
    data = build_dataset(cases, audits, fb, replay_ratio=1.0, heldout_fraction=0.2, seed="s")
    everything = data.train + data.heldout
    corrections = {e.prompt: e.completion for e in everything if e.source == CORRECTION}
    assert len(corrections) == 10
    assert corrections["Question  0 "] == "better answer 0"
    replay = [e for e in everything if e.source == REPLAY]
    assert len(replay) == 10  # one per correction
    assert all(e.prompt != "traffic 0" for e in replay)  # negative feedback
    assert all(normalize_text(e.prompt) != "question 3" for e in replay)
    assert data.stats["accepted_available"] == 29
    assert len(data.regression_suite) == 2 and len(data.general_heldout) == 2


def test_a_negative_verdict_counts_only_from_the_answers_tenant() -> None:
    """Request ids leak (responses, logs): another tenant's thumbs-down must not pull an answer out of
    the replay sample; the owner's, or one without a tenant, does; an answer without a tenant has no owner."""
    cases = [bad_case(f"question {i}", f"answer {i}") for i in range(10)]
    audits = [audit("rival's target", "kept", "req-a", tenant="acme"),
              audit("owner's complaint", "dropped", "req-b", tenant="acme"),
              audit("legacy verdict", "dropped", "req-c", tenant="acme"),
              audit("no owner", "dropped", "req-d", tenant=""),
              audit("untouched", "kept", "req-e", tenant="acme")]
    fb = [feedback("req-a", -1, tenant="rival"), feedback("req-b", -1, tenant="acme"),
          feedback("req-c", -1, tenant=""), feedback("req-d", -1, tenant="rival"),
          feedback("req-e", 1, tenant="acme")]
    data = build_dataset(cases, audits, fb, replay_ratio=1.0, heldout_fraction=0.2, seed="s")
    replayed = {e.prompt for e in data.train + data.heldout if e.source == REPLAY}
    assert replayed == {"rival's target", "untouched"}


def test_same_inputs_in_any_order_give_the_same_digest() -> None:
    cases, audits, fb = _inputs()
    a = build_dataset(cases, audits, fb, seed="s")
    random.Random(3).shuffle(cases)
    random.Random(4).shuffle(audits)
    b = build_dataset(cases, audits, fb, seed="s")
    assert a.digest == b.digest and a.train == b.train and a.heldout == b.heldout
    assert build_dataset(cases, audits, fb, seed="other").digest != a.digest
    cases[0] = bad_case(cases[0].prompt, cases[0].correction + "!", at=5000.0)
    assert build_dataset(cases, audits, fb, seed="s").digest != a.digest


def test_train_and_heldout_do_not_overlap() -> None:
    cases, audits, fb = _inputs()
    data = build_dataset(cases, audits, fb, seed="s")
    assert not {e.key for e in data.train} & {e.key for e in data.heldout}


def test_save_load_round_trip_checks_digest(tmp_path: Path) -> None:
    cases, audits, fb = _inputs()
    data = build_dataset(cases, audits, fb, seed="s")
    path = tmp_path / "data.json"
    data.save(path)
    assert TrainingData.load(path).digest == data.digest
    path.write_text(path.read_text().replace("answer 5", "answer 6"))
    with pytest.raises(ValueError, match="digest"):
        TrainingData.load(path)


def test_normalize_text() -> None:
    assert normalize_text("  The ANSWER\tis  42. ") == "the answer is 42"
    assert normalize_text("ＡＢＣ！") == "abc"
