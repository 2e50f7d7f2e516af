"""`entroloop bench detectors` on the labelled entropy corpora: which corpora, and the figures it
gives for each (with token ids and from entropies alone), next to the fleet's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from entroloop.benchmarks.detectors import CORPUS_DIR, corpora, figures, run_corpora
from entroloop.contract.settings import Settings

LOOP = {"entropy": [0.3, 0.1, 0.6] * 20, "token_ids": [11, 12, 13] * 20}
NORMAL = {"entropy": [3.1, 3.8, 2.9, 3.5, 4.0, 3.3, 2.7, 3.6, 3.9, 3.2] * 6, "token_ids": list(range(60))}
# a low run that repeats neither its ids nor its entropies: the literal rule's false alarm
QUIET = {"entropy": [3.0] * 10 + np.random.default_rng(5).uniform(0.02, 1.2, 30).round(3).tolist() + [3.0] * 10,
         "token_ids": list(range(100, 150))}


def _write(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_every_corpus_but_the_tuning_ones_is_reported(tmp_path: Path) -> None:
    for name in ("dev.jsonl", "held_out.jsonl", "lm_traces_dev.jsonl", "lm_traces_test.jsonl"):
        _write(tmp_path / name, [])
    (tmp_path / "README.md").write_text("not a corpus")
    assert [p.name for p in corpora(tmp_path)] == ["held_out.jsonl", "lm_traces_test.jsonl"]
    assert [p.name for p in corpora(CORPUS_DIR)] == [
        "held_out.jsonl", "held_out2.jsonl", "lm_traces_fresh.jsonl", "lm_traces_read.jsonl", "lm_traces_read2.jsonl",
        "lm_traces_read3.jsonl", "lm_traces_read4.jsonl", "lm_traces_read5.jsonl", "lm_traces_test.jsonl",
    ]


def test_corpus_figures_with_ids_and_from_entropies_alone(tmp_path: Path) -> None:
    lines = [
        {"id": "loop", "model": "m", **LOOP, "label": {"loop": True, "gibberish": False}},
        {"id": "normal", "model": "m", **NORMAL, "label": {"loop": False, "gibberish": False}},
        {"id": "quiet", "model": "m", **QUIET, "label": {"loop": False, "gibberish": False}},
        {"id": "unlabelled", "model": "m", **LOOP},
    ]
    _write(tmp_path / "traces.jsonl", lines)
    results = run_corpora(Settings(entropy_evidence=True), folder=tmp_path)
    assert set(results) == {f"{rule} [{mode}]" for rule in ("repetition_loop", "gibberish", "entropy_baseline")
                            for mode in ("traces", "traces, entropies only")}
    for mode in ("traces", "traces, entropies only"):
        loop = results[f"repetition_loop [{mode}]"]
        # the cycle is found (by its ids, or by its entropies), the non-repeating low run is not
        assert (loop["precision"], loop["recall"]) == (1.0, 1.0), (mode, loop)
        assert "traces.jsonl: 3 labelled requests" in loop["note"]
        assert "read by a person" not in loop["note"]
    static = run_corpora(Settings(entropy_evidence=False), folder=tmp_path)["repetition_loop [traces]"]
    assert static["precision"] == 0.5  # the literal rule flags the quiet run too: the test can tell them apart

    figs = {f.name: f for f in figures(results)}
    assert figs["repetition_loop [traces] precision / recall"].target == "P >= 0.95, R >= 0.95"
    assert figs["repetition_loop [traces, entropies only] precision / recall"].target == "P >= 0.90, R >= 0.90"
    assert figs["repetition_loop [traces] precision / recall"].met is True
    assert not any(name.startswith("repetition_loop [") and "events/s" in name for name in figs)


def test_corrections_figures_skip_the_tuning_file(tmp_path: Path) -> None:
    from entroloop.benchmarks.detectors import CORRECTIONS_DIR, run_corrections

    right = {"prompt": "p", "output": "The fee is 5 USD.", "corrected": "The fee is 7 USD.", "labels": ["number", "fact"]}
    wrong = {"prompt": "p", "output": "Hello there.", "corrected": "Hello there!", "labels": ["compliance"]}
    _write(tmp_path / "dev.jsonl", [right])  # tuned on: never reported
    _write(tmp_path / "cases.jsonl", [right, wrong, {k: v for k, v in right.items() if k != "labels"}])
    results = run_corrections(Settings(), folder=tmp_path)
    assert list(results) == ["bad_cases [cases]"]
    figs = {f.name: f for f in figures(results)}
    exact = figs["bad_cases exact label set [cases]"]
    assert (exact.value, exact.met, exact.target) == (0.5, False, ">= 0.90")  # 1 of the 2 labelled lines
    assert "2 hand-written labelled pairs" in exact.note
    assert figs["bad_cases label compliance [cases] precision / recall"].note.startswith("recall 0.0;")
    assert {p.name for p in CORRECTIONS_DIR.glob("*.jsonl")} >= {"dev.jsonl", "heldout.jsonl"}


def test_a_corpus_with_surprisals_is_also_scored_as_the_vllm_tap_ships_it(tmp_path: Path) -> None:
    # gibberish that only the sampled tokens' surprisal shows: the model's entropy stays ordinary
    hot = {"entropy": [3.5] * 60, "token_ids": list(range(60)), "surprisal": [9.0] * 60}
    calm = {"entropy": [3.5] * 60, "token_ids": list(range(60, 120)), "surprisal": [2.0] * 60}
    _write(tmp_path / "lm.jsonl", [
        {"id": "hot", "model": "m", **hot, "label": {"loop": False, "gibberish": True}},
        {"id": "calm", "model": "m", **calm, "label": {"loop": False, "gibberish": False}},
    ])
    results = run_corpora(Settings(entropy_evidence=True), folder=tmp_path)
    assert {name.split(" [")[1] for name in results} == {"lm]", "lm, token ids without surprisals]",
                                                         "lm, entropies only]"}
    assert (results["gibberish [lm]"]["precision"], results["gibberish [lm]"]["recall"]) == (1.0, 1.0)
    for mode in ("lm, token ids without surprisals", "lm, entropies only"):
        assert results[f"gibberish [{mode}]"]["recall"] == 0.0, mode  # the surprisal was the only evidence
    for result in results.values():  # labels with the text rules' verdict kept beside them: a reader's
        assert "labels: read by a person" not in result["note"]
    _write(tmp_path / "lm.jsonl", [{"id": "calm", "model": "m", **calm, "label": {"loop": False, "gibberish": False},
                                    "generator": {"rule_label": {"loop": False, "gibberish": False}}}])
    for result in run_corpora(Settings(entropy_evidence=True), folder=tmp_path).values():
        assert "labels: read by a person" in result["note"]
    figs = {f.name: f for f in figures(results)}
    assert figs["gibberish [lm, token ids without surprisals] precision / recall"].target == "P >= 0.95, R >= 0.95"


def test_corrections_results_have_what_the_bench_command_prints() -> None:
    from entroloop.benchmarks.detectors import run_corrections

    for result in run_corrections(Settings()).values():  # the checked-in held-out corrections
        assert {"precision", "recall", "events_per_s", "exact_set"} <= result.keys()
        assert result["exact_set"] >= 0.9
