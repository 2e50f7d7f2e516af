"""BadCaseJoiner: join in both arrival orders, TTL, dedup, diff, minimal span, labels, confidence."""

from __future__ import annotations

import msgspec
from entroloop.streams.bad_cases import (
    REGRESSION_LABEL,
    BadCaseJoiner,
    JoinEntry,
    decode_entry,
    encode_entry,
    minimal_failing_span,
    token_diff,
)
from hypothesis import example, given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from entroloop.contract.codec import decode, encode
from entroloop.contract.records import BadCase

from .analytics_records import audit, feedback

RESPONSE = "您的账户余额为120.00元，到期日2024-03-05。"
CORRECTION = "您的账户余额为150.00元，到期日2024-03-05。"


def test_join_audit_first() -> None:
    joiner = BadCaseJoiner()
    assert joiner.process(audit("r1", prompt="余额?", response=RESPONSE, adapter="a1")) == []
    (case,) = joiner.process(feedback("r1", corrected=CORRECTION, rating=1))
    assert isinstance(case, BadCase)
    assert case.labels[:2] == ["number", "fact"] and case.adapter == "a1" and case.prompt == "余额?"
    assert case.request_id == "r1"


def test_join_feedback_first_gives_the_same_bad_case() -> None:
    a = audit("r2", response=RESPONSE)
    fb = feedback("r2", corrected=CORRECTION, rating=1)
    first = BadCaseJoiner()
    assert first.process(fb) == []
    (late,) = first.process(a)
    second = BadCaseJoiner()
    second.process(a)
    (early,) = second.process(fb)
    assert encode(late) == encode(early)  # same id and bytes whichever came first


def test_feedback_without_correction_is_ignored_and_not_stored() -> None:
    joiner = BadCaseJoiner()
    assert joiner.process(feedback("r3", corrected="", rating=0)) == []
    assert "r3" not in joiner.state


def test_redelivered_feedback_yields_one_bad_case_and_second_correction_joins() -> None:
    joiner = BadCaseJoiner()
    fb = feedback("r4", corrected=CORRECTION)
    joiner.process(fb)
    joiner.process(fb)  # redelivery before the audit: it waits once
    (case,) = joiner.process(audit("r4", response=RESPONSE))
    (again,) = joiner.process(fb)  # redelivery after the join: the same bad case, which the sinks absorb
    assert encode(again) == encode(case)
    assert len(joiner.state["r4"].joined_feedback) == 1
    other = feedback("r4", corrected="您的账户余额为130.00元，到期日2024-03-05。")
    (second,) = joiner.process(other)
    assert second.event_id != case.event_id


def test_a_bad_case_that_never_reached_the_broker_comes_again_when_its_inputs_are_replayed() -> None:
    """The join's changelog can reach the broker while its bad case does not (another partition on
    another broker; or the broker refused the bad case and the worker stopped before committing).
    The restarted worker recovers the join from the changelog and is handed the same audit and
    feedback again: before, it found the feedback "already joined" and the correction was lost."""
    a, fb = audit("r6", response=RESPONSE), feedback("r6", corrected=CORRECTION)
    for first, then in ((a, fb), (fb, a)):
        crashed = BadCaseJoiner()
        crashed.process(first)
        (lost,) = crashed.process(then)
        # what recovery reads back from the compacted changelog
        recovered = {rid: decode_entry(encode_entry(entry)) for rid, entry in crashed.state.items()}
        restarted = BadCaseJoiner(state=recovered)
        made_again = restarted.process(first) + restarted.process(then)  # replayed from the last commit
        assert [encode(r) for r in made_again] == [encode(lost)] * 2  # same id: stored once


def test_ttl_expires_by_event_time() -> None:
    joiner = BadCaseJoiner(ttl_s=100)
    joiner.process(feedback("r5", corrected=CORRECTION, at=1000.0))
    joiner.on_watermark(1099.0)
    assert "r5" in joiner.state
    joiner.on_watermark(1101.0)
    assert "r5" not in joiner.state and joiner.expired_unjoined == 1
    assert joiner.process(audit("r5", response=RESPONSE, at=1102.0)) == []


def test_state_survives_a_restart_through_encoded_entries() -> None:
    """What a changelogged table does on recovery: values round-trip as bytes."""
    joiner = BadCaseJoiner()
    joiner.process(feedback("r6", corrected=CORRECTION))
    changelog = {k: encode_entry(v) for k, v in joiner.state.items()}
    restored = BadCaseJoiner(state={k: decode_entry(v) for k, v in changelog.items()})
    (case,) = restored.process(audit("r6", response=RESPONSE))
    assert case.correction == CORRECTION
    assert isinstance(restored.state["r6"], JoinEntry)


def test_state_is_written_back_on_every_change() -> None:
    """A Faust table only changelogs on assignment: the joiner must assign, not only mutate."""

    class RecordingTable(dict):
        sets: list[str] = []

        def __setitem__(self, key: str, value: JoinEntry) -> None:
            self.sets.append(key)
            super().__setitem__(key, msgspec.msgpack.decode(encode_entry(value), type=JoinEntry))

    table = RecordingTable()
    joiner = BadCaseJoiner(state=table)
    joiner.process(feedback("r7", corrected=CORRECTION))
    joiner.process(audit("r7", response=RESPONSE))
    assert table.sets.count("r7") >= 2
    assert table["r7"].audit is not None and table["r7"].waiting_feedback == []


def test_bad_case_record_round_trips_the_codec() -> None:
    joiner = BadCaseJoiner()
    joiner.process(audit("r8", response=RESPONSE))
    (case,) = joiner.process(feedback("r8", corrected=CORRECTION))
    assert decode(encode(case), window=None) == case  # hand-built records live in 1970: no time window


def test_token_diff_cjk_characters_and_numbers() -> None:
    assert token_diff("重量5克", "重量5千克") == [("insert", "", "千")]
    assert token_diff(RESPONSE, CORRECTION) == [("replace", "120.00", "150.00")]
    assert token_diff("the cat sat", "the dog sat") == [("replace", "cat", "dog")]
    assert token_diff("a b c", "a c") == [("delete", "b", "")]


def test_minimal_span_widens_to_whole_tokens() -> None:
    (start, end), replacement = minimal_failing_span(RESPONSE, CORRECTION)
    assert RESPONSE[start:end] == "120.00元" and replacement == "150.00元"  # the amount with its unit
    span, rep = minimal_failing_span("price 12.5 total", "price 12.8 total")
    assert "price 12.5 total"[span[0] : span[1]] == "12.5" and rep == "12.8"
    assert minimal_failing_span("same", "same") == ((4, 4), "")


def test_minimal_span_is_never_empty_nor_half_a_token() -> None:
    """An inserted 0 or m blames the whole amount or quantity, a changed city the whole CJK run."""
    cases = [
        ("500.5元", "500.50元", "500.5元", "500.50元"),
        ("500g", "500mg", "500g", "500mg"),
        ("每袋重量为5克。", "每袋重量为5千克。", "5克", "5千克"),
        ("会议在北京举行，请准时", "会议在上海举行，请准时", "会议在北京举行", "会议在上海举行"),
        ("hello world", "hello big world", "world", "big world"),
        ("due 2024-03-05 ok", "due 2024-03-06 ok", "2024-03-05", "2024-03-06"),
    ]
    for response, correction, blamed, replacement in cases:
        (start, end), rep = minimal_failing_span(response, correction)
        assert (response[start:end], rep) == (blamed, replacement), response


@hsettings(max_examples=200, deadline=None)
@given(st.text(alphabet="ab 12.元克千日", max_size=30), st.text(alphabet="ab 12.元克千日", max_size=30))
def test_minimal_span_replacement_always_yields_the_correction(response: str, correction: str) -> None:
    (start, end), replacement = minimal_failing_span(response, correction)
    assert 0 <= start <= end <= len(response)
    assert response[:start] + replacement + response[end:] == correction


@given(st.text(alphabet="ab 5.元g千克北京,", max_size=12), st.text(alphabet="ab 5.元g千克北京,", max_size=12))
@example("a  b", "a x b")  # an insertion inside spacing: blame the nearest chunk
@hsettings(max_examples=300, deadline=None)
def test_minimal_span_is_empty_only_when_nothing_can_be_blamed(response: str, correction: str) -> None:
    (start, end), replacement = minimal_failing_span(response, correction)
    assert response[:start] + replacement + response[end:] == correction
    if response != correction and response.strip():
        assert start < end, (response, correction)


def test_labels_confidence_and_regression_flag() -> None:
    joiner = BadCaseJoiner(regression_confidence=0.8, negative_rating=2)
    joiner.process(audit("r9", response=RESPONSE))
    (focused,) = joiner.process(feedback("r9", corrected=CORRECTION, rating=1, error_type="number"))
    # base 0.1 + rule 0.3 + focused 0.2 + negative 0.2 + declared 0.1 + declared names a rule 0.1
    assert focused.confidence == 1.0
    assert focused.labels == ["number", "fact", REGRESSION_LABEL]
    assert RESPONSE[focused.minimal_span[0] : focused.minimal_span[1]] == "120.00元"  # the amount with its unit

    joiner.process(audit("r10", response="the sky is green today"))
    (vague,) = joiner.process(feedback("r10", corrected="I would rather not talk about the sky", rating=4))
    # a rewrite changes the content (fact), but no specific rule explains it: low confidence
    assert vague.labels == ["fact"] and vague.confidence < 0.5
    joiner.process(audit("r11", response="the sky is green today"))
    (spacing,) = joiner.process(feedback("r11", corrected="the sky is green today.", rating=4))
    assert spacing.labels == ["other"]  # punctuation only: nothing a label names


def test_declared_error_type_is_a_label_and_rewrites_stay_below_regression() -> None:
    """The fleet's off-intent case: another question's answer, corrected, declared off_intent."""
    joiner = BadCaseJoiner(regression_confidence=0.8)
    joiner.process(audit("o1", response="Ticket 12345 is resolved; the customer confirmed the fix."))
    (case,) = joiner.process(
        feedback("o1", corrected="Order 12345 will be delivered on 2026-05-03.", rating=-1, error_type="off_intent")
    )
    assert "off_intent" in case.labels and REGRESSION_LABEL not in case.labels
    assert case.confidence < 0.8


def test_fleet_shaped_format_errors() -> None:
    joiner = BadCaseJoiner()
    joiner.process(audit("z1", response="订单12345的退款金额为1234.5元。"))
    (zh,) = joiner.process(feedback("z1", corrected="订单12345的退款金额为1234.50元。", rating=-1, error_type="format"))
    assert zh.labels[0] == "amount_format" and "number" not in zh.labels and REGRESSION_LABEL in zh.labels
    joiner.process(audit("e1", response="The refund for order 12345 is 1234 USD."))
    (en,) = joiner.process(feedback("e1", corrected="The refund for order 12345 is 1234.00 USD.", rating=-1, error_type="format"))
    # Same value, two decimals added: a format change, not a new number (nor a fact)
    assert en.labels[:2] == ["amount_format", "format"]


def test_unit_and_currency_corrections_labelled() -> None:
    joiner = BadCaseJoiner()
    joiner.process(audit("u1", response="每袋重量为5克。"))
    (units,) = joiner.process(feedback("u1", corrected="每袋重量为5千克。", rating=1))
    assert units.labels[:2] == ["fact", "unit"]
    joiner.process(audit("c1", response="手续费为12元。"))
    (money,) = joiner.process(feedback("c1", corrected="手续费为12.00元。", rating=1))
    assert money.labels[0] == "amount_format"


def test_from_settings_uses_the_deployments_compliance_terms_and_patterns() -> None:
    """The joiner and the per-response checker read the same lexicon and patterns from settings."""
    from entroloop.streams.response_rules import ResponseRuleChecker

    from entroloop.contract.settings import Settings

    settings = Settings(compliance_lexicon=["包过"], compliance_patterns=[r"躺着(?:就能)?赚"])
    joiner = BadCaseJoiner.from_settings(settings)
    joiner.process(audit("cfg", response="考试包过，躺着就能赚"))
    (case,) = joiner.process(feedback("cfg", corrected="考试需要认真准备"))
    assert "compliance" in case.labels
    assert BadCaseJoiner().rules.compare("考试包过", "考试需要认真准备") == ["fact"]  # not a default term
    checker = ResponseRuleChecker.from_settings(settings)
    (alert,) = checker.process(audit("cfg2", response="考试包过，躺着就能赚"))
    assert alert.value == 2.0
