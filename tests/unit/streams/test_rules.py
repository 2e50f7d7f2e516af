"""entroloop.streams.rules: one hand-built case per rule, both in check_response and compare."""

from __future__ import annotations

import pytest
from entroloop.streams.rules import (
    AMOUNT_FORMAT,
    COMPLIANCE,
    DATE,
    DEFAULT_COMPLIANCE_PATTERNS,
    FACT,
    JSON_SCHEMA,
    NUMBER,
    UNIT,
    ComplianceLexicon,
    ResponseRules,
    bad_yuan_amounts,
    dates,
    invalid_dates,
    json_schema_violations,
    numbers,
    quantities,
    tokenize,
    without_dates,
)

SCHEMA = {
    "type": "object",
    "required": ["amount", "currency"],
    "properties": {"amount": {"type": "number"}, "currency": {"enum": ["CNY", "USD"]}},
}


def test_tokenize_splits_cjk_per_character_and_latin_by_words() -> None:
    toks = tokenize("总价 1,234.50元, don't stop 3.5kg")
    assert [t.text for t in toks] == ["总", "价", "1,234.50", "元", ",", "don't", "stop", "3.5", "kg"]
    text = "总价 1,234.50元, don't stop 3.5kg"
    assert all(text[t.start : t.end] == t.text for t in toks)


def test_tokenize_keeps_short_texts_for_the_next_call_and_never_a_long_one() -> None:
    from entroloop.streams import rules

    short, long = "总价 1,234.50元, don't stop", "很长的回答 " * 1000
    rules._recent_tokens.cache_clear()
    first = tokenize(short)
    assert tokenize(short) == first and rules._recent_tokens.cache_info().hits == 1
    first.clear()  # a caller's list is its own
    assert [t.text for t in tokenize(short)][:2] == ["总", "价"]
    held = rules._recent_tokens.cache_info().currsize
    assert len(tokenize(long)) == 5000 and rules._recent_tokens.cache_info().currsize == held


def test_tokenize_kana_hangul_are_per_character() -> None:
    assert [t.text for t in tokenize("東京タワー 서울")] == ["東", "京", "タ", "ワ", "ー", "서", "울"]


def test_numbers_normalised_and_dates_excluded() -> None:
    assert numbers("1,200.0 and 3.50 on 2024-03-05") == ["1200", "3.5"]


def test_without_dates_blanks_each_date_in_place() -> None:
    text = "付款 500 元，2024年3月5日前；March 5, 2024 之后 3月6日 再付 20"
    blanked = without_dates(text)
    assert len(blanked) == len(text)  # offsets of what is left keep their meaning
    assert "2024" not in blanked and "March" not in blanked and "3月6日" not in blanked
    assert blanked.split() == ["付款", "500", "元，", "前；", "之后", "再付", "20"]
    assert without_dates("no dates, 12 apples") == "no dates, 12 apples"


def test_quantities_prefer_longest_unit() -> None:
    assert quantities("5千克 and 3 kg and 7克") == [("5", "千克"), ("3", "kg"), ("7", "克")]


@pytest.mark.parametrize(
    ("text", "bad"),
    [
        ("共12元", ["12"]),
        ("共12.5元", ["12.5"]),
        ("共12.00元", []),
        ("共1,234.50元", []),
        ("共1,234.5元", ["1,234.5"]),
        ("¥30", ["30"]),
        ("￥30", ["30"]),  # the full-width mark alone: no 元, no ¥
        ("￥30.00", []),
        ("no money here 12", []),
    ],
)
def test_currency_format(text: str, bad: list[str]) -> None:
    assert bad_yuan_amounts(text) == bad


def test_dates_parse_both_forms_and_flag_impossible_days() -> None:
    assert dates("2024-03-05 与 2024年3月6日") == [(2024, 3, 5), (2024, 3, 6)]
    assert invalid_dates("2024-02-30 2024-02-29 2023-13-01") == [(2024, 2, 30), (2023, 13, 1)]


def test_compliance_lexicon_aho_corasick_offsets_case_insensitive() -> None:
    lex = ComplianceLexicon(["保证收益", "risk-free"])
    text = "本产品保证收益, totally RISK-FREE"
    hits = lex.find(text)
    assert [(text[s:e], t) for s, e, t in hits] == [("保证收益", "保证收益"), ("RISK-FREE", "risk-free")]
    assert ComplianceLexicon([], patterns=[]).find(text) == []


@pytest.mark.parametrize(
    ("text", "found"),
    [
        ("这只基金稳赚，放心买", ["稳赚"]),
        ("我们保证理赔，三天到账", ["保证理赔"]),
        ("百分百赔付", ["百分百赔付"]),
        ("This fund offers guaranteed returns.", ["guaranteed returns"]),
        ("You cannot lose money here.", ["cannot lose"]),
        ("本产品不保证收益，也并非无风险", []),  # negated: the compliant wording
        ("Returns are not guaranteed and the fund is not risk-free.", []),
        ("稳赚不赔", ["稳赚不赔"]),  # lexicon term and pattern overlap: counted once
        ("无风险利率为2%，the risk-free rate is 2%", []),  # finance terms, not promises
    ],
)
def test_compliance_paraphrase_patterns_and_negation(text: str, found: list[str]) -> None:
    assert [text[s:e] for s, e, _ in ComplianceLexicon().find(text)] == found


def test_compliance_patterns_from_settings_reach_compare() -> None:
    from entroloop.contract.settings import Settings

    rules = ResponseRules.from_settings(Settings(compliance_lexicon=["包过"], compliance_patterns=[r"躺着(?:就能)?赚"]))
    assert COMPLIANCE in rules.compare("考试包过", "考试需要认真准备")
    assert COMPLIANCE in rules.compare("躺着就能赚钱", "投资有风险")


def test_json_schema_violations() -> None:
    assert json_schema_violations('{"amount": 1.5, "currency": "CNY"}', SCHEMA) == []
    assert json_schema_violations('结果：```json\n{"amount": 1.5, "currency": "CNY"}\n```', SCHEMA) == []
    (err,) = json_schema_violations('{"amount": "1.5", "currency": "CNY"}', SCHEMA)
    assert err.startswith("amount:")
    assert json_schema_violations('{"amount": 1.5,', SCHEMA)[0].startswith("not valid JSON")
    assert json_schema_violations("plain text", SCHEMA) == ["no JSON object in the response"]


def test_check_response_finds_each_rule() -> None:
    rules = ResponseRules(json_schemas={"json": SCHEMA})
    found = rules.check_response("保证收益 12元 2024-02-30", route="default")
    assert sorted({v.rule for v in found}) == sorted([COMPLIANCE, AMOUNT_FORMAT, DATE])
    assert [v.rule for v in rules.check_response('{"amount": 1}', route="json")] == [JSON_SCHEMA]
    assert rules.check_response("一切正常，共12.00元，2024-02-29到期") == []


@pytest.mark.parametrize(
    ("response", "correction", "labels"),
    [
        ("总价120.00元", "总价150.00元", [NUMBER, FACT]),
        ("重量5克", "重量5千克", [FACT, UNIT]),
        ("weighs 5 g", "weighs 5 kg", [FACT, UNIT]),
        ("重5公斤", "重5 kg", [UNIT]),  # the same unit written otherwise: form only
        ("共12元", "共12.00元", [AMOUNT_FORMAT]),
        ("2024-03-05到期", "2024-03-06到期", [FACT, DATE]),
        ("2024年3月5日到期", "2024-03-05到期", [DATE]),  # same date, other format: no fact
        ("本产品保证收益", "本产品有风险", [FACT, COMPLIANCE]),
        ("the sky is green", "the sky is blue", [FACT]),
        ("收益100元", "收益120.00元", [NUMBER, FACT, AMOUNT_FORMAT]),
        ("costs 1234 USD", "costs 1234.00 USD", [AMOUNT_FORMAT]),  # same value: format only
        ("costs 1,234.00 USD", "costs 1234.00 USD", [AMOUNT_FORMAT]),  # thousands separator only
        ("共3.5元", "共3.50元", [AMOUNT_FORMAT]),
        ("退款1.5万元", "退款15000.00元", [AMOUNT_FORMAT]),  # 万 is a multiplier, not a new value
        ("我们不保证收益", "我们不保证收益。", []),  # negated term is compliant; punctuation is form
    ],
)
def test_compare_labels(response: str, correction: str, labels: list[str]) -> None:
    assert ResponseRules().compare(response, correction) == labels


def test_compare_json_schema_label_only_when_correction_fixes_it() -> None:
    rules = ResponseRules(json_schemas={"json": SCHEMA})
    assert JSON_SCHEMA in rules.compare('{"amount": "3"}', '{"amount": 3, "currency": "CNY"}', route="json")
    assert JSON_SCHEMA not in rules.compare('{"amount": "3"}', '{"amount": "4"}', route="json")


def test_the_joined_pattern_guard_finds_what_the_patterns_find() -> None:
    """The one-scan guard (``_any_of``) must never hide a pattern's match: same hits with and
    without it, on texts with and without matches; patterns it cannot join safely get no guard."""
    from entroloop.streams.rules import _any_of

    texts = ["这个产品稳赚不赔，保证收益", "not risk-free at all; guaranteed returns", "普通的回答，没有承诺。",
             "abab xyzzy", "Insider tips: sure bet", ""]
    guarded = ComplianceLexicon(patterns=(*DEFAULT_COMPLIANCE_PATTERNS, r"xyz+y"))
    unguarded = ComplianceLexicon(patterns=(*DEFAULT_COMPLIANCE_PATTERNS, r"xyz+y"))
    unguarded._any_pattern = None
    assert guarded._any_pattern is not None
    for text in texts:
        assert guarded.find(text) == unguarded.find(text), text
    # a back-reference would point at another pattern's group once joined; a mid-pattern global
    # flag does not compile joined: both scan every pattern, and still find their matches
    backref = ComplianceLexicon(terms=(), patterns=(r"(ab)\1",))
    assert backref._any_pattern is None and [t for _, _, t in backref.find("x abab y")] == ["abab"]
    assert _any_of(["a(?i)b"]) is None
