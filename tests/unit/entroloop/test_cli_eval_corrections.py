"""`entroloop eval corrections FILE.jsonl [--json] [--predictions OUT]` on small files (with and
without labels), bad lines, and the hand-written corpora in tests/data/corrections (their figures
are the ones docs/processors.md reports)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.unit.entroloop.eval_files import run_eval, write_lines

CORPUS = Path(__file__).resolve().parents[2] / "data" / "corrections"


def test_labelled_lines_give_exact_set_and_per_label_figures_as_the_last_json_line(tmp_path: Path) -> None:
    data = write_lines(tmp_path / "labelled.jsonl", [
        {"id": "a", "prompt": "运费", "output": "运费为8元。", "corrected": "运费为8.00元。", "labels": ["amount_format"],
         "source": "ignored"},
        "",
        {"id": 2, "prompt": "dose", "output": "Take 500g daily.", "corrected": "Take 500mg daily.",
         "labels": ["fact", "unit"]},
        # deliberately mislabelled: the figures must show the miss
        {"prompt": "余额", "output": "余额为100.00元。", "corrected": "余额为120.00元。", "labels": ["amount_format"]},
    ])
    out = tmp_path / "predictions.jsonl"
    result = run_eval("corrections", str(data), "--json", "--predictions", str(out))
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["exact_set"] == round(2 / 3, 4) and figures["lines"] == 3 and figures["labelled"] == 3
    assert figures["per_label"]["amount_format"] == {"precision": 1.0, "recall": 0.5, "support": 2}
    assert figures["per_label"]["number"] == {"precision": 0.0, "recall": 0.0, "support": 0}
    assert figures["per_label"]["unit"] == {"precision": 1.0, "recall": 1.0, "support": 1}
    assert "exact label set" in result.stdout  # the table
    predictions = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [p["id"] for p in predictions] == ["a", 2, None]
    assert predictions[0]["labels"] == ["amount_format"]
    assert predictions[1]["minimal_failing_example"] == {"start": 5, "end": 9, "output": "500g", "corrected": "500mg"}
    assert predictions[2]["labels"] == ["number", "fact"]


def test_lines_without_labels_still_give_predictions(tmp_path: Path) -> None:
    data = write_lines(tmp_path / "plain.jsonl", [
        {"id": "x", "prompt": "p", "output": "这款基金稳赚，放心买", "corrected": "基金有风险，投资需谨慎"},
        {"prompt": "p", "output": "ok", "corrected": "ok."},
    ])
    out = tmp_path / "p.jsonl"
    result = run_eval("corrections", str(data), "--json", "--predictions", str(out))
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures == {"exact_set": 0.0, "per_label": {}, "lines": 2, "labelled": 0}
    first, second = (json.loads(line) for line in out.read_text(encoding="utf-8").splitlines())
    assert first["id"] == "x" and first["labels"] == ["fact", "compliance"]
    assert first["minimal_failing_example"]["output"]  # never an empty span
    assert second == {"id": None, "labels": ["other"],
                      "minimal_failing_example": {"start": 0, "end": 2, "output": "ok", "corrected": "ok."}}


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "bad.jsonl:2: not valid JSON"),
        (json.dumps({"prompt": "p", "output": "o"}), "bad.jsonl:2:"),  # no corrected
        (json.dumps({"prompt": "p", "output": "o", "corrected": 5}), "bad.jsonl:2:"),
        (json.dumps({"prompt": "p", "output": "o", "corrected": "c", "labels": ["numbers"]}),
         "bad.jsonl:2: labels ['numbers'] are not in the vocabulary"),
        ("[1, 2]", "bad.jsonl:2: expected a JSON object"),
    ],
)
def test_a_bad_line_exits_2_naming_the_line(tmp_path: Path, line: str, message: str) -> None:
    good = json.dumps({"prompt": "p", "output": "a", "corrected": "b"})
    data = write_lines(tmp_path / "bad.jsonl", [good, line])
    result = run_eval("corrections", str(data))
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())


@pytest.mark.parametrize(("name", "floor"), [("dev.jsonl", 0.95), ("heldout.jsonl", 0.90)])
def test_hand_written_corpora_meet_the_reported_figures(name: str, floor: float) -> None:
    """dev: tuned on (reported 0.985); held-out: measured once after the labeller was frozen
    (reported 0.964), the issue's target is >= 0.90 on >= 100 cases. A regression below fails."""
    result = run_eval("corrections", str(CORPUS / name), "--json")
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["labelled"] >= (100 if name == "heldout.jsonl" else 60)
    assert figures["exact_set"] >= floor, figures
    labels = {label for label, v in figures["per_label"].items() if v["support"]}
    assert labels >= {"number", "fact", "amount_format", "unit", "date", "json_schema", "compliance"}
