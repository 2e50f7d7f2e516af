"""tests/corpora/reader_agreement.py: Cohen's kappa on known tables, and the two files it writes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.corpora.lm_traces import sheet_key
from tests.corpora.reader_agreement import (
    Agreement,
    agreement,
    read_labels,
    split_files,
)


def test_kappa_of_a_textbook_table() -> None:
    # 50 items: both yes 20, first only 5, second only 10, both no 15 -> p_o 0.7, p_e 0.5, kappa 0.4
    table = Agreement(both=20, first_only=5, second_only=10, neither=15)
    assert table.observed == pytest.approx(0.7)
    assert table.kappa == pytest.approx(0.4)


def test_kappa_is_zero_at_chance_and_one_when_readings_match() -> None:
    assert Agreement(both=25, first_only=25, second_only=25, neither=25).kappa == pytest.approx(0.0)
    assert Agreement(both=7, first_only=0, second_only=0, neither=3).kappa == pytest.approx(1.0)
    assert Agreement(both=0, first_only=0, second_only=0, neither=9).kappa == 1.0  # nothing to disagree on


def _lines() -> list[dict]:
    labels = [(True, False), (False, True), (False, False), (False, True)]
    return [{"id": f"x-{i}", "model": "m", "entropy": [1.0], "label": {"loop": loop, "gibberish": gib}}
            for i, (loop, gib) in enumerate(labels)]


def _second(path: Path, lines: list[dict], flip: int) -> Path:
    rows = []
    for i, line in enumerate(lines):
        label = dict(line["label"])
        if i == flip:
            label["gibberish"] = not label["gibberish"]
        rows.append({"key": sheet_key(line["id"]), **label, "why": "read"})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def test_agreement_counts_each_label_and_the_files_keep_order(tmp_path: Path) -> None:
    lines = _lines()
    second = read_labels(_second(tmp_path / "second.jsonl", lines, flip=1))
    counts = agreement(lines, second)
    assert counts["loop"].as_dict()["agreement"] == 1.0
    assert (counts["gibberish"].both, counts["gibberish"].first_only, counts["gibberish"].second_only,
            counts["gibberish"].neither) == (1, 1, 0, 2)
    relabelled, agreed = split_files(lines, second, tmp_path / "out", "traces")
    assert [json.loads(raw)["label"]["gibberish"] for raw in relabelled.read_text().splitlines()] == [
        False, False, False, True]
    assert [json.loads(raw)["id"] for raw in agreed.read_text().splitlines()] == ["x-0", "x-2", "x-3"]


def test_a_reading_that_misses_a_line_or_repeats_a_key_is_refused(tmp_path: Path) -> None:
    lines = _lines()
    path = _second(tmp_path / "second.jsonl", lines, flip=-1)
    with pytest.raises(ValueError, match="none for 1 lines"):
        agreement(lines + [{**lines[0], "id": "x-9"}], read_labels(path))
    path.write_text(path.read_text() + path.read_text().splitlines()[0] + "\n")
    with pytest.raises(ValueError, match=r"second.jsonl:5: sheet key .* labelled twice"):
        read_labels(path)
