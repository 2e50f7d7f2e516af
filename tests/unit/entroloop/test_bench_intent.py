"""The intent part of `entroloop bench detectors` (entroloop/benchmarks/intent.py): the model alone and
the cascade over the same fleet pairs and labelled set, each stage's pairs/s and decided share, the
AUROC rows with issue 15's floors, and the rows it writes. A test embedder stands in for the model
(pure bookkeeping here; the real model runs in tests/integration/test_bench_detectors.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from entroloop.collectors.synthetic_fleet import SyntheticFleet
from entroloop.streams.intent_similarity import IntentSimilarityScorer

from entroloop.benchmarks import detectors, intent
from entroloop.benchmarks.report import write_benchmarks
from entroloop.contract.settings import Settings
from tests.unit.entroloop.eval_files import write_lines


class FirstLetterEmbedder:
    """Cosine 1 when two texts start with the same character, else 0."""

    name = "first-letter"

    def embed(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), 16), dtype=np.float32)
        for i, text in enumerate(texts):
            out[i, ord(text[0]) % 16] = 1.0
        return out


@pytest.fixture
def measured(tmp_path: Path) -> dict:
    # long enough for the lexical stage not to settle it off intent (it does so to ~20-word answers)
    long_answer = ("Reset it in Settings, Security, Password: type the old password, then the new one twice, and "
                   "press Save. The new password works from your next login on; if you forgot the old one, use the "
                   "Forgot password link on the login page and follow the e-mail we send you.")
    labelled = write_lines(tmp_path / "pairs.jsonl", [
        {"lang": "en", "query": "Reset my password", "answer": long_answer, "on_intent": True},
        {"lang": "en", "query": "Reset my password", "answer": "No.", "on_intent": False},
        {"lang": "zh", "query": "退款多久到账？", "answer": "退款审核通过后三到五个工作日原路退回到您的账户里面。", "on_intent": True},
        {"lang": "zh", "query": "退款多久到账？", "answer": "抱歉。", "on_intent": False},
    ])
    fleet = list(SyntheticFleet(seed=3).requests(60))
    labels = {q.labels.request_id: q.labels for q in fleet}
    records = [r for q in fleet for r in q.records]
    settings = Settings(intent_sample_rate=1.0)
    scorer = IntentSimilarityScorer.from_settings(settings, embedder=FirstLetterEmbedder())
    return intent.measure(scorer, records, labels, settings, runs=2, labelled_set=labelled)


def test_the_model_alone_the_cascade_and_each_stage_are_reported(measured: dict) -> None:
    assert set(measured) == {"intent_similarity", "intent_similarity_cascade", "intent_stage_lexical", "intent_stage_model"}
    for result in measured.values():
        assert result["events_per_s"] > 0
    shares = measured["intent_similarity_cascade"]["decided_share"]
    assert shares["lexical"] + shares["model"] == pytest.approx(1.0)
    assert measured["intent_stage_lexical"]["decided_share"] == shares["lexical"]
    # the labelled set's figures, per language, for both scorers
    for name in ("intent_similarity", "intent_similarity_cascade"):
        assert set(measured[name]["labelled_set"]) == {"zh", "en", "all"}
    # the one-word refusal is settled off intent (cascade) or starts with another letter (model alone)
    assert measured["intent_similarity"]["labelled_set"]["en"]["auroc"] == 1.0
    assert measured["intent_similarity_cascade"]["labelled_set"]["en"]["auroc"] == 1.0


def test_rows_are_medians_with_targets_and_reach_the_report(measured: dict, tmp_path: Path) -> None:
    rows = {f.name: f for f in detectors.figures(measured)}
    speed = rows["intent_similarity_cascade events/s (1 core)"]
    assert speed.runs == 2 and speed.target == ">= 500" and speed.met is (speed.value >= 500)
    assert "the lexical stage decided" in speed.note and "needs the model to see at most" in speed.note
    assert rows["intent_stage_lexical pairs/s (1 core)"].runs == 2
    auroc = rows["intent_similarity AUROC zh [pairs.jsonl]"]
    assert auroc.target == ">= 0.85" and auroc.met is (auroc.value >= 0.85) and "balanced accuracy" in auroc.note
    assert rows["intent_similarity_cascade AUROC en [pairs.jsonl]"].target == ">= 0.92"
    assert "intent_similarity_cascade precision / recall" in rows
    report = write_benchmarks(list(rows.values()), tmp_path / "B.md").read_text()
    assert "| intent_stage_model pairs/s (1 core) |" in report


def test_a_missing_intent_pairs_file_is_refused_before_any_work(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from entroloop.cli import app

    missing = tmp_path / "nowhere.jsonl"
    result = CliRunner().invoke(app, ["bench", "detectors", "--intent-pairs", str(missing), "--out", str(tmp_path / "B.md")])
    assert result.exit_code == 2
    assert "--intent-pairs" in result.output and "does not exist" in result.output
    assert not (tmp_path / "B.md").exists()
