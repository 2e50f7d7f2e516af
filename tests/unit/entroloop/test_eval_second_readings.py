"""The reader-labelled LM splits read a second time (tests/data/entropy/README.md, item 8): how far the
two readings agree, and the detectors scored by `entroloop eval entropy` against each reading and on
the texts both readings agree on (the figures docs/processors.md reports)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.corpora.reader_agreement import agreement, read_labels, split_files
from tests.unit.entroloop.eval_files import entropy_figures

CORPUS = Path(__file__).resolve().parents[2] / "data" / "entropy"
SPLITS = ("test", "read2", "read3", "read4", "read5")


@pytest.fixture(autouse=True)
def _evidence_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENTROLOOP_ENTROPY_EVIDENCE", "true")


def _lines(split: str) -> list[dict]:
    return [json.loads(raw) for raw in (CORPUS / f"lm_traces_{split}.jsonl").read_text().splitlines()]


def _second(split: str) -> dict[str, dict[str, bool]]:
    return read_labels(CORPUS / "reading" / f"{split}_second_labels.jsonl")


@pytest.mark.parametrize("split", SPLITS)
def test_the_two_readings_cover_the_same_texts_and_agree_far_beyond_chance(split: str) -> None:
    counts = agreement(_lines(split), _second(split))
    assert counts["loop"].total == len(_lines(split))
    assert counts["loop"].kappa >= 0.98 and counts["gibberish"].kappa >= 0.92


def test_on_read4_the_second_reader_scores_what_the_detectors_score(tmp_path: Path) -> None:
    """READ4, the split furthest under the precision bar: scored as a detector against the first
    reading, the second reader's gibberish precision is the detectors' own (0.9125: 7 texts called
    gibberish that the first reader called normal; not the same 7 texts, 3 are shared), and on the
    texts both readers agree on the detectors miss no gibberish."""
    lines, second = _lines("read4"), _second("read4")
    gibberish = agreement(lines, second)["gibberish"]
    assert (gibberish.both, gibberish.first_only, gibberish.second_only) == (73, 0, 7)
    first = entropy_figures(CORPUS / "lm_traces_read4.jsonl", True, tmp_path)["gibberish"]
    assert first["precision"] == round(gibberish.both / (gibberish.both + gibberish.second_only), 4) == 0.9125
    _, agreed = split_files(lines, second, tmp_path, "read4")
    assert entropy_figures(agreed, True, tmp_path)["gibberish"]["recall"] == 1.0


def test_the_pooled_agreed_texts_meet_issue_14_targets(tmp_path: Path) -> None:
    """Every split with a second reading, pooled, kept to the texts both readings agree on: loops and
    gibberish ≥ 0.95 / 0.95 with token ids; from entropies alone (sampling entropies where the split
    has them) loops ≥ 0.90 / 0.90. Against the second reading alone, pooled, the same bar holds."""
    agreed_lines, second_lines = [], []
    for split in SPLITS:
        second_path, agreed_path = split_files(_lines(split), _second(split), tmp_path / split, split)
        agreed_lines += agreed_path.read_text().splitlines()
        second_lines += second_path.read_text().splitlines()
    agreed = tmp_path / "agreed.jsonl"
    agreed.write_text("\n".join(agreed_lines) + "\n")
    by_second = tmp_path / "second.jsonl"
    by_second.write_text("\n".join(second_lines) + "\n")
    for figures in (entropy_figures(agreed, True, tmp_path), entropy_figures(by_second, True, tmp_path)):
        for name in ("loop", "gibberish"):
            assert figures[name]["precision"] >= 0.95 and figures[name]["recall"] >= 0.95, (name, figures)
    assert entropy_figures(agreed, True, tmp_path)["requests"] == 969
    alone = entropy_figures(agreed, False, tmp_path)["loop"]
    assert alone["precision"] >= 0.90 and alone["recall"] >= 0.90
