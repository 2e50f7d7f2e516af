"""`entroloop eval entropy FILE.jsonl [--json] [--predictions OUT]` on small files, bad lines, and
the independent corpora in tests/data/entropy (the held-out figures are the ones docs report)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.unit.entroloop.eval_files import entropy_figures, run_eval, write_lines

CORPUS = Path(__file__).resolve().parents[2] / "data" / "entropy"

LOOP_IDS = [11, 12, 13] * 20
LOOP_ENTROPY = [0.3, 0.1, 0.6] * 20
# ordinary text: neither its ids nor its entropies repeat (an entropy sequence that repeats with a
# period is a loop even without ids)
NORMAL = np.random.default_rng(7).uniform(2.7, 4.0, 60).round(2).tolist()
GIBBERISH = (np.random.default_rng(8).uniform(2.9, 3.5, 15).round(2).tolist()
             + np.random.default_rng(9).uniform(7.2, 9.9, 48).round(2).tolist())


@pytest.fixture(autouse=True)
def _evidence_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Evidence mode is the default; pinned so a developer's environment cannot change what these tests measure."""
    monkeypatch.setenv("ENTROLOOP_ENTROPY_EVIDENCE", "true")


def _labelled(tmp_path: Path) -> Path:
    return write_lines(tmp_path / "labelled.jsonl", [
        {"id": "loop", "model": "m", "entropy": LOOP_ENTROPY, "token_ids": LOOP_IDS,
         "label": {"loop": True, "gibberish": False}, "source": "ignored"},
        {"id": "normal", "model": "m", "entropy": NORMAL, "token_ids": list(range(60)),
         "label": {"loop": False, "gibberish": False}},
        {"id": "gib", "model": "m", "entropy": GIBBERISH, "label": {"loop": False, "gibberish": True}},
        {"id": "missed", "model": "m", "entropy": NORMAL, "label": {"loop": True, "gibberish": False}},
    ])


def test_labelled_lines_give_precision_recall_f1_as_the_last_json_line(tmp_path: Path) -> None:
    out = tmp_path / "pred.jsonl"
    result = run_eval("entropy", str(_labelled(tmp_path)), "--json", "--predictions", str(out))
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["requests"] == 4
    assert figures["loop"] == {"precision": 1.0, "recall": 0.5, "f1": 0.6667, "support": 2, "predicted": 1}
    assert figures["gibberish"] == {"precision": 1.0, "recall": 1.0, "f1": 1.0, "support": 1, "predicted": 1}
    assert "loop" in result.stdout and "precision" in result.stdout  # the table
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["id"], r["loop"], r["gibberish"]) for r in rows] == [
        ("loop", True, False), ("normal", False, False), ("gib", False, True), ("missed", False, False)]
    (alert,) = rows[0]["alerts"]
    evidence = json.loads(alert["baseline"])
    assert alert["rule"] == "repetition_loop" and evidence["period"] == 3 and evidence["evidence"] == "token_ids"


def test_lines_without_labels_still_give_predictions(tmp_path: Path) -> None:
    data = write_lines(tmp_path / "unlabelled.jsonl", [
        {"id": 1, "model": "m", "entropy": LOOP_ENTROPY}, "", {"model": "m", "entropy": NORMAL}])
    out = tmp_path / "pred.jsonl"
    result = run_eval("entropy", str(data), "--json", "--predictions", str(out))
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["requests"] == 2 and figures["labelled"] == 0
    assert figures["loop"]["precision"] is None and figures["loop"]["predicted"] == 1
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(r["id"], r["loop"]) for r in rows] == [(1, True), (None, False)]
    assert json.loads(rows[0]["alerts"][0]["baseline"])["evidence"] == "entropy_periodicity"


def test_without_json_no_json_line(tmp_path: Path) -> None:
    result = run_eval("entropy", str(_labelled(tmp_path)))
    assert result.exit_code == 0 and "gibberish" in result.stdout
    assert not result.stdout.strip().splitlines()[-1].startswith("{")


@pytest.mark.parametrize(
    ("lines", "line_no", "words"),
    [
        ([{"model": "m", "entropy": [1.0]}, "{not json"], 2, ["not valid JSON"]),
        ([{"entropy": [1.0]}], 1, ["model"]),
        ([{"model": "m", "entropy": [1.0]}, {"model": "m", "entropy": [1.0, -2.0]}], 2, ["entropy[1]", ">= 0"]),
        ([{"model": "m", "entropy": [1.0, 2.0], "token_ids": [1]}], 1, ["token_ids", "2 entropies"]),
        ([{"model": "m", "entropy": []}], 1, ["empty"]),
        ([{"model": "m", "entropy": [1.0], "label": {"loop": "yes"}}], 1, ["loop"]),
        (["[1, 2]"], 1, ["JSON object"]),
        ([{"model": "m", "entropy": [1.0, 2.0], "surprisal": [0.5]}], 1, ["surprisal", "2 entropies"]),
        ([{"model": "m", "entropy": [1.0, 2.0], "surprisal": [0.5, -1.0]}], 1, ["surprisal[1]", ">= 0"]),
        ([{"model": "m", "entropy": [1.0, 2.0], "sampling_entropy": [0.5]}], 1, ["sampling_entropy", "2 entropies"]),
        ([{"model": "m", "entropy": [1.0], "sampling_entropy": [float("inf")]}], 1, ["sampling_entropy[0]", ">= 0"]),
    ],
)
def test_a_bad_line_exits_2_naming_its_line(tmp_path: Path, lines: list[object], line_no: int, words: list[str]) -> None:
    data = write_lines(tmp_path / "bad.jsonl", lines)
    result = run_eval("entropy", str(data))
    assert result.exit_code == 2, result.output
    assert f"bad.jsonl:{line_no}" in result.output.replace("\n", "")
    for word in words:
        assert word in result.output.replace("\n", "")
    assert "Traceback" not in result.output


@pytest.mark.parametrize("with_ids", [True, False])
def test_the_held_out_corpus(with_ids: bool, tmp_path: Path) -> None:
    """Reported figures (thresholds were tuned on dev.jsonl only). Issue 14's target with ids is
    0.95/0.95: loops meet it, gibberish precision is 0.948 (see docs/processors.md)."""
    figures = entropy_figures(CORPUS / "held_out.jsonl", with_ids, tmp_path)
    assert figures["requests"] == 700
    assert figures["loop"]["precision"] >= 0.98 and figures["loop"]["recall"] >= 0.97
    assert figures["gibberish"]["precision"] >= 0.94 and figures["gibberish"]["recall"] >= 0.99


@pytest.mark.parametrize("with_ids", [True, False])
def test_a_second_draw_of_the_held_out_assumptions(with_ids: bool, tmp_path: Path) -> None:
    """held_out2.jsonl: the held-out settings with another seed, drawn and scored once after every
    setting was final (loops 0.986 / 1.000 with ids, 1.000 / 1.000 alone; gibberish 0.954 / 0.988
    both ways). Its false alarms are of held_out's kinds: three from the creative model before its
    band exists (its 5th, 8th and 18th requests), one a chatty model 0.27 nats over its band's edge."""
    figures = entropy_figures(CORPUS / "held_out2.jsonl", with_ids, tmp_path)
    assert figures["requests"] == 700
    assert figures["loop"]["precision"] >= 0.98 and figures["loop"]["recall"] == 1.0
    assert figures["gibberish"]["precision"] >= 0.95 and figures["gibberish"]["recall"] >= 0.98


def test_the_static_rules_alone_fail_on_the_held_out_corpus(tmp_path: Path) -> None:
    """The comparison the evidence must win: the literal rules flag normal low- and high-band text."""
    figures = entropy_figures(CORPUS / "held_out.jsonl", True, tmp_path, env={"ENTROLOOP_ENTROPY_EVIDENCE": "false"})
    assert figures["loop"]["precision"] < 0.5 and figures["gibberish"]["precision"] < 0.5


def test_the_dev_corpus_it_was_tuned_on(tmp_path: Path) -> None:
    figures = entropy_figures(CORPUS / "dev.jsonl", False, tmp_path)
    assert figures["loop"]["f1"] == 1.0 and figures["gibberish"]["f1"] == 1.0


def _by_the_rules(path: Path, tmp_path: Path) -> Path:
    """A copy of a read split whose ``label`` is the text rules' verdict again (generator.rule_label)."""
    copy = tmp_path / f"{path.stem}-by-the-rules.jsonl"
    copy.write_text("".join(
        json.dumps({**row, "label": row["generator"]["rule_label"]}) + "\n"
        for row in map(json.loads, path.read_text().splitlines())
    ))
    return copy


def test_the_real_model_test_split(tmp_path: Path) -> None:
    """Reported figures on a real tiny LM's traces (settings chosen on lm_traces_dev.jsonl only; see
    tests/data/entropy/README.md). Loops are found by repetition at ~3.5 nats, where no low-entropy
    rule looks; gibberish only with the sampled tokens' surprisal (the pre-temperature entropy of this
    model's gibberish is no higher than of its normal text). First labelled by the text rules; later
    every text was read (labels committed before scoring, no setting changed): the rules' five
    false loops (one ~10-character message 3-4 times) are loops to the reader, and the reader's
    gibberish is stricter at T=1.5 (four texts flagged that the reader called half readable)."""
    test = CORPUS / "lm_traces_test.jsonl"
    full = entropy_figures(_by_the_rules(test, tmp_path), True, tmp_path)
    assert full["requests"] == 188 and full["loop"]["support"] == 33 and full["gibberish"]["support"] == 70
    assert full["loop"]["recall"] == 1.0 and full["loop"]["precision"] >= 0.86
    assert full["gibberish"]["precision"] >= 0.96 and full["gibberish"]["recall"] >= 0.91
    read = entropy_figures(test, True, tmp_path)
    assert read["loop"]["support"] == 38 and read["gibberish"]["support"] == 67
    assert read["loop"]["precision"] == 1.0 and read["loop"]["recall"] == 1.0
    assert read["gibberish"]["precision"] >= 0.94 and read["gibberish"]["recall"] >= 0.98
    alone = entropy_figures(test, False, tmp_path)
    # from entropies alone two loops are missed (e.g. lm-0225, 115 line breaks whose entropies wander)
    assert alone["loop"]["recall"] >= 0.94 and alone["loop"]["precision"] == 1.0
    assert alone["gibberish"]["predicted"] == 0  # without surprisal: nothing to go on


def test_the_real_model_fresh_split(tmp_path: Path) -> None:
    """The same model on 68 prompts that neither DEV nor TEST holds, generated after every setting
    was final and scored before anyone read it (tests/data/entropy/README.md): by the text rules'
    labels the figures held up on traffic nobody tuned on, and so did the misses (loop precision,
    gibberish both ways). Later every text was read like the READ splits (labels committed before
    they were scored; no setting changed): the rules' false loops were loops to the reader (all 68
    greedy texts), and the one false loop left repeats "%s, " six times, which the criteria call a
    loop too (the reader passed it over). Gibberish: one T=1.0 text missed, two T=1.5 texts flagged
    that the reader called half readable."""
    fresh = CORPUS / "lm_traces_fresh.jsonl"
    full = entropy_figures(_by_the_rules(fresh, tmp_path), True, tmp_path)
    assert full["requests"] == 340 and full["loop"]["support"] == 59 and full["gibberish"]["support"] == 134
    assert full["loop"]["recall"] == 1.0 and full["loop"]["precision"] >= 0.85
    assert full["gibberish"]["precision"] >= 0.93 and full["gibberish"]["recall"] >= 0.91
    read = entropy_figures(fresh, True, tmp_path)
    assert read["loop"]["support"] == 68 and read["gibberish"]["support"] == 134
    assert read["loop"]["recall"] == 1.0 and read["loop"]["precision"] >= 0.98
    assert read["gibberish"]["precision"] >= 0.98 and read["gibberish"]["recall"] >= 0.99
    alone = entropy_figures(fresh, False, tmp_path)
    assert alone["loop"]["precision"] == 1.0 and alone["loop"]["recall"] >= 0.98
    assert alone["gibberish"]["predicted"] == 0  # FRESH has no sampling entropies: its model is gone


def test_the_real_model_read_by_a_person(tmp_path: Path) -> None:
    """The same model's traces labelled by a person who read every decoded text (prompt and text only:
    no id, regime, entropy or rule label; tests/data/entropy/README.md). READ2 was generated and read
    after the settings were final and scored once; READ was scored before the surprisal edge was re-set
    on DEV's reader labels (then: gibberish recall 0.929), so only READ2 is blind to it. Misses in
    READ2: two greedy loops (two lines alternating in no fixed order, and a paragraph said again
    with changes) and one short T=1.5 text; one T=1.5 text the reader called half broken is flagged.
    The two loops are found since near-cycles count (READ2 is no longer blind to that change)."""
    blind = entropy_figures(CORPUS / "lm_traces_read2.jsonl", True, tmp_path)
    assert blind["requests"] == 200 and blind["loop"]["support"] == 39 and blind["gibberish"]["support"] == 79
    assert blind["loop"]["precision"] == 1.0 and blind["loop"]["recall"] == 1.0
    assert entropy_figures(CORPUS / "lm_traces_read2.jsonl", True, tmp_path,
                    env={"ENTROLOOP_LOOP_TEMPLATE_LOOKBACK": "0"})["loop"]["recall"] < 0.95  # exact periods only
    assert blind["gibberish"]["precision"] >= 0.98 and blind["gibberish"]["recall"] >= 0.98
    alone = entropy_figures(CORPUS / "lm_traces_read2.jsonl", False, tmp_path)
    assert alone["loop"]["precision"] == 1.0 and alone["loop"]["recall"] >= 0.94
    assert alone["gibberish"]["predicted"] == 0  # the tap's entropy is before temperature
    first = entropy_figures(CORPUS / "lm_traces_read.jsonl", True, tmp_path)
    assert first["loop"]["support"] == 40 and first["loop"]["precision"] == first["loop"]["recall"] == 1.0
    assert first["gibberish"]["precision"] == 1.0 and first["gibberish"]["recall"] >= 0.95


def test_the_real_model_second_blind_read_split(tmp_path: Path) -> None:
    """READ3: 40 more prompts, generated after READ2 was scored, read and labelled (labels committed)
    before any detector ran on it, with no setting changed since READ2. Its weights are another
    sibling's (trained on another machine). Disagreements, read after scoring: one false loop (five
    variants of one usage line that the reader called a list, borderline), three gibberish texts
    under the surprisal edge (one T=1.5 word salad, two borderline T=1.0 texts); from entropies
    alone one loop is missed (156 tokens of blank lines, whose entropies wander).

    Its sampled requests later gained the tap's sampling entropies (regenerated by the same model,
    token for token; labels untouched), scored once with the edge set on DEV2: from entropies alone
    gibberish goes from nothing flagged to 0.988 / 0.975 (the one false alarm is a T=1.5 text the
    reader called normal; the misses are the two T=1.0 texts, sampled exactly as the model samples
    itself). On this corpus gibberish comes from high temperatures, so the signal mostly says how
    hot the sampler ran."""
    read3 = CORPUS / "lm_traces_read3.jsonl"
    before = entropy_figures(read3, True, tmp_path, drop=("sampling_entropy",))  # as first scored
    assert before["requests"] == 200 and before["loop"]["support"] == 40 and before["gibberish"]["support"] == 81
    assert before["loop"]["recall"] == 1.0 and before["loop"]["precision"] >= 0.97
    assert before["gibberish"]["precision"] == 1.0 and before["gibberish"]["recall"] >= 0.96
    blind = entropy_figures(read3, True, tmp_path)
    assert blind["loop"] == before["loop"]
    assert blind["gibberish"]["precision"] >= 0.98 and blind["gibberish"]["recall"] >= 0.97
    alone = entropy_figures(read3, False, tmp_path)  # entropies and sampling entropies: no token ids
    assert alone["loop"]["precision"] == 1.0 and alone["loop"]["recall"] >= 0.97
    assert alone["gibberish"]["precision"] >= 0.98 and alone["gibberish"]["recall"] >= 0.97
    model_only = entropy_figures(read3, False, tmp_path, drop=("sampling_entropy",))
    assert model_only["loop"] == alone["loop"] and model_only["gibberish"]["predicted"] == 0


def test_the_real_model_third_blind_read_split_with_sampling_entropies(tmp_path: Path) -> None:
    """READ4: 40 more prompts, generated with the tap's sampling entropies after the sampling edge
    was set on DEV2, read and labelled (labels committed) before any detector ran on it; scored once.
    Disagreements, read after scoring: seven T=1.5 texts flagged as gibberish that the reader called
    about half readable (all seven marked borderline); two greedy loops missed, each two option lines
    alternating with changes (no exact period): found since near-cycles count, after READ4 was scored.
    Pooled with READ2 and READ3 (600 blind requests) the token-id figures meet 0.95 / 0.95; READ3 +
    READ4 (the 400 with sampling entropies) meet 0.90 / 0.90 from entropies alone."""
    read4 = CORPUS / "lm_traces_read4.jsonl"
    blind = entropy_figures(read4, True, tmp_path)
    assert blind["requests"] == 200 and blind["loop"]["support"] == 41 and blind["gibberish"]["support"] == 73
    assert blind["loop"]["precision"] == 1.0 and blind["loop"]["recall"] == 1.0
    assert blind["gibberish"]["precision"] >= 0.91 and blind["gibberish"]["recall"] == 1.0
    alone = entropy_figures(read4, False, tmp_path)
    assert alone["loop"]["precision"] == 1.0 and alone["loop"]["recall"] >= 0.90
    assert alone["gibberish"]["precision"] >= 0.91 and alone["gibberish"]["recall"] == 1.0
    assert entropy_figures(read4, False, tmp_path, drop=("sampling_entropy",))["gibberish"]["predicted"] == 0
    names = ("lm_traces_read2.jsonl", "lm_traces_read3.jsonl", "lm_traces_read4.jsonl")
    pooled = tmp_path / "read2-read3-read4.jsonl"
    pooled.write_text("".join((CORPUS / name).read_text() for name in names))
    both = entropy_figures(pooled, True, tmp_path)
    assert both["requests"] == 600
    assert min(both["loop"]["precision"], both["loop"]["recall"]) >= 0.95
    assert min(both["gibberish"]["precision"], both["gibberish"]["recall"]) >= 0.95
    sampled = tmp_path / "read3-read4.jsonl"
    sampled.write_text("".join((CORPUS / name).read_text() for name in names[1:]))
    alone = entropy_figures(sampled, False, tmp_path)
    assert alone["requests"] == 400
    assert min(alone["loop"]["precision"], alone["loop"]["recall"]) >= 0.90
    assert min(alone["gibberish"]["precision"], alone["gibberish"]["recall"]) >= 0.90


def test_the_real_model_fourth_blind_read_split(tmp_path: Path) -> None:
    """READ5: 40 more prompts, generated after near-cycle loops were added, committed unlabelled, read
    by a helper session that saw only the reading sheet and the criteria (never a detector), labels
    committed, then scored once. With token ids it meets 0.95 / 0.95 on its own; from entropies and
    sampling entropies, 0.90 / 0.90. Disagreements, read after scoring, are all borderline calls:
    three T=1.5 texts the reader called about half readable are flagged, one T=1.0 word salad is
    missed. One loop (a line repeated with one word changed) is found by the near-cycle evidence
    alone; the model's own entropies flag no gibberish (its hot sampling is not in them)."""
    read5 = CORPUS / "lm_traces_read5.jsonl"
    blind = entropy_figures(read5, True, tmp_path)
    assert blind["requests"] == 200 and blind["loop"]["support"] == 40 and blind["gibberish"]["support"] == 78
    assert (blind["loop"]["precision"], blind["loop"]["recall"]) == (1.0, 1.0)
    assert min(blind["gibberish"]["precision"], blind["gibberish"]["recall"]) >= 0.96
    exact_only = entropy_figures(read5, True, tmp_path, env={"ENTROLOOP_LOOP_TEMPLATE_LOOKBACK": "0"})
    assert exact_only["loop"]["recall"] == 0.975
    alone = entropy_figures(read5, False, tmp_path)
    assert alone["loop"]["precision"] == 1.0 and alone["loop"]["recall"] >= 0.92
    assert min(alone["gibberish"]["precision"], alone["gibberish"]["recall"]) >= 0.96
    assert entropy_figures(read5, False, tmp_path, drop=("sampling_entropy",))["gibberish"]["predicted"] == 0


def test_the_sampling_edge_sits_in_dev2s_gap(tmp_path: Path) -> None:
    """DEV2 (the split the sampling edge was set on, labelled by the text rules): from entropies
    alone, with sampling entropies, the edge flags every request whose sampler ran far flatter than
    the model; the figures the setting's description reports. Without them: nothing."""
    dev2 = CORPUS / "lm_traces_dev2.jsonl"
    alone = entropy_figures(dev2, False, tmp_path)
    assert alone["requests"] == 200 and alone["gibberish"]["support"] == 77
    assert (alone["gibberish"]["precision"], alone["gibberish"]["recall"]) == (0.925, 0.961)
    assert entropy_figures(dev2, False, tmp_path, drop=("sampling_entropy",))["gibberish"]["predicted"] == 0


def test_the_real_model_test_split_under_the_static_rules_alone(tmp_path: Path) -> None:
    """What the literal rules see on the same traces: not one real loop (none is low-entropy), and
    gibberish at precision below one half (normal text has high-entropy runs too)."""
    figures = entropy_figures(CORPUS / "lm_traces_test.jsonl", True, tmp_path, env={"ENTROLOOP_ENTROPY_EVIDENCE": "false"})
    assert figures["loop"]["recall"] == 0.0
    assert figures["gibberish"]["precision"] < 0.5
