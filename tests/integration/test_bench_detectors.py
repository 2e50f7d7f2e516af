"""`entroloop bench detectors` reports quality and speed per detector and writes the Markdown report."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HAND_WRITTEN_PAIRS = Path(__file__).resolve().parents[1] / "data" / "intent" / "pairs.jsonl"


def test_bench_detectors_json_and_report(tmp_path):
    out = tmp_path / "BENCH.md"
    # a quarter of the hand-written intent set, both languages and both labels (the file alternates them in
    # fours): the model reads ~7 pairs/s here, so the whole set cost this test a minute; `--intent-pairs` says
    # which set the AUROC rows were measured on, and the report names it
    lines = HAND_WRITTEN_PAIRS.read_text(encoding="utf-8").splitlines()
    subset = tmp_path / "pairs_quarter.jsonl"
    subset.write_text("".join(line + "\n" for i, line in enumerate(lines) if i % 8 in (0, 1)), encoding="utf-8")
    proc = subprocess.run(
        [sys.executable, "-m", "entroloop.cli", "bench", "detectors", "--requests", "400", "--out", str(out), "--json",
         "--runs", "1",  # one timing run of the intent scorers: the median of three is the report's, not the test's
         "--intent-pairs", str(subset)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    for name in ("repetition_loop", "gibberish", "bad_cases", "fallback_rates"):
        assert set(result[name]) == {"precision", "recall", "events_per_s"}
        assert result[name]["events_per_s"] > 0
    assert result["repetition_loop"]["recall"] >= 0.95 and result["repetition_loop"]["precision"] >= 0.9
    # intent: the default scorer, its cascade and each stage of it (pairs/s; the share each decided is in the notes)
    for name in ("intent_similarity", "intent_similarity_cascade", "intent_stage_lexical", "intent_stage_model"):
        assert result[name]["events_per_s"] > 0, name
    shares = result["intent_similarity_cascade"]["decided_share"]
    assert shares["lexical"] + shares["model"] == pytest.approx(1.0)
    for name in ("intent_similarity", "intent_similarity_cascade"):  # both on the hand-written set
        assert 0.5 < result[name]["labelled_set"]["zh"]["auroc"] <= 1.0, name
    text = out.read_text()
    assert "| repetition_loop events/s (1 core)" in text and "Machine:" in text
    assert "| intent_similarity_cascade AUROC en [pairs_quarter.jsonl]" in text and "| intent_stage_lexical pairs/s" in text
    assert (tmp_path / "BENCH.json").exists()
