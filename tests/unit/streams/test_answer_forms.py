"""Question forms and answer cues (streams/answer_forms.py): what a question asks for, in English and
Chinese, and whether an answer has that form."""

from __future__ import annotations

import pytest
from entroloop.streams.answer_forms import FORM_FEATURES, answer_has_form, asked_forms, form_features, is_evasive


@pytest.mark.parametrize(
    ("query", "forms"),
    [
        ("When will I get my deposit back?", ["time"]),
        ("How much does the repair cost?", ["quantity"]),
        ("What is the monthly fee of plan 12?", ["quantity"]),
        ("What is the refund amount for my order?", ["quantity"]),
        ("How do I descale a kettle?", ["steps"]),
        ("Why does my washer smell?", ["reason"]),
        ("Can I wash wool in the machine?", ["yesno"]),
        ("Where is the lost and found?", ["place"]),
        ("Tips for a first marathon", []),
        ("押金什么时候退？", ["time"]),
        ("修一次要多少钱？", ["quantity"]),
        ("怎么给水壶除垢？", ["steps"]),
        ("洗衣机为什么有异味？", ["reason"]),
        ("羊毛衫能机洗吗？", ["yesno"]),
        ("失物招领处在哪里？", ["place"]),
        ("多久换一次滤芯，大概多少钱？", ["time", "quantity"]),
    ],
)
def test_asked_forms(query: str, forms: list[str]) -> None:
    assert asked_forms(query) == forms


@pytest.mark.parametrize(
    ("answer", "form", "has"),
    [
        ("Within 14 days of moving out.", "time", True),
        ("The deposit is paid by bank transfer.", "time", False),
        ("$45 for the visit plus parts.", "quantity", True),
        ("Our technicians are certified.", "quantity", False),
        ("1. Fill it with vinegar\n2. Boil and rinse", "steps", True),
        ("Kettles are made of steel.", "steps", False),
        ("Because detergent builds up in the seal.", "reason", True),
        ("Yes, on the wool cycle.", "yesno", True),
        ("Wool comes from sheep.", "yesno", False),
        ("At the front desk on the ground floor.", "place", True),
        ("7个工作日内退还。", "time", True),
        ("押金为一个月房租。", "time", True),  # 月 counts as a time cue: the head weighs the cue, not a verdict
        ("上门费50元。", "quantity", True),
        ("先倒入白醋，然后煮沸。", "steps", True),
        ("因为密封圈里残留洗涤剂。", "reason", True),
        ("可以，选羊毛程序即可。", "yesno", True),
        ("羊毛来自绵羊。", "yesno", False),
        ("在一楼服务台。", "place", True),
    ],
)
def test_answer_has_form(answer: str, form: str, has: bool) -> None:
    assert answer_has_form(answer, form) is has


def test_evasive_cues_in_both_languages() -> None:
    assert is_evasive("I'm sorry, but I can't help with that request.")
    assert is_evasive("Thanks for reaching out! Your question has been logged.")
    assert is_evasive("抱歉，这个问题我无法回答。")
    assert is_evasive("您的问题已记录，稍后会有专人联系您。")
    assert not is_evasive("Lift the wiper arm and slide the old blade off.")
    assert not is_evasive("抬起雨刮臂，按下卡扣取下旧雨刮片。")


def test_form_features_score_met_missed_and_unknown_forms() -> None:
    met = form_features("When do I get my deposit back?", "Within 14 days after you move out.")
    missed = form_features("When do I get my deposit back?", "The deposit is paid with the first rent.")
    unknown = form_features("Tips for a first marathon", "Start slowly and drink at every station.")
    assert set(met) == set(FORM_FEATURES)
    assert (met["form_asked"], met["form_met"]) == (1.0, 1.0)
    assert (missed["form_asked"], missed["form_met"]) == (1.0, 0.0)
    assert (unknown["form_asked"], unknown["form_met"]) == (0.0, 0.5)
    assert form_features("How do I cancel?", "Sorry, I can't help with that.")["evasive"] == 1.0
