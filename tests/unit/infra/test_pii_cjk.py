"""PII glued to Chinese text, the kinds added for issue 12, and bank-card false positives.

Python's ``\\w`` matches CJK, so a look-around written with ``\\w`` never fires in
``手机号13900001111``: these tests glue random Chinese text to both sides of every kind.
"""

from __future__ import annotations

import random
import re

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from entroloop.infra import pii
from entroloop.infra.pii import PiiRedactor, luhn_valid

KEY = "test-key"
PLACEHOLDER = re.compile(r"\[([A-Z0-9_]+):([0-9a-f]{16})\]")
_CN_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_PROVINCES = ("11", "31", "44", "51", "33", "65")

# Chinese characters and full-width punctuation, never digits or Latin letters.
han = st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF)
cjk_punct = st.sampled_from(list("，。：；！？、（）《》“”【】"))
chinese = st.text(alphabet=st.one_of(han, cjk_punct), min_size=1, max_size=12)
digits = lambda n: st.text(alphabet="0123456789", min_size=n, max_size=n)


def _luhn_complete(body: str) -> str:
    return next(body + d for d in "0123456789" if luhn_valid(body + d))


def _id18(province: str, rest: str, year: int, month: int, day: int, seq: str) -> str:
    body = f"{province}{rest}{year:04d}{month:02d}{day:02d}{seq}"
    total = sum(int(c) * w for c, w in zip(body, _CN_ID_WEIGHTS))
    return body + "10X98765432"[total % 11]


emails = st.builds(
    lambda user, host, tld: f"{user}@{host}.{tld}",
    st.from_regex(r"[a-z][a-z0-9._]{0,10}[a-z0-9]", fullmatch=True),
    st.from_regex(r"[a-z][a-z0-9-]{0,8}[a-z0-9]", fullmatch=True),
    st.sampled_from(["com", "org", "cn", "com.cn", "io"]),
)
mobiles = st.builds(
    lambda second, rest, style: style.format(second + rest[:1], rest[1:5], rest[5:9]),
    st.sampled_from("3456789"),
    digits(9),
    st.sampled_from(["1{}{}{}", "1{} {} {}", "1{}-{}-{}", "+861{}{}{}", "+86 1{} {} {}"]),
)
landlines = st.builds(
    lambda area, first, rest, sep: f"{area}{sep}{first}{rest}",
    st.sampled_from(["010", "021", "020", "0755", "0571", "0931"]),
    st.sampled_from("2345678"),
    st.one_of(digits(6), digits(7)),
    st.sampled_from(["-", "", " "]),
)
id18s = st.builds(
    _id18, st.sampled_from(_PROVINCES), digits(4), st.integers(1930, 2010), st.integers(1, 12),
    st.integers(1, 28), digits(3),
)
id15s = st.builds(
    lambda p, rest, y, m, d, seq: f"{p}{rest}{y:02d}{m:02d}{d:02d}{seq}",
    st.sampled_from(_PROVINCES), digits(4), st.integers(0, 99), st.integers(1, 12), st.integers(1, 28), digits(3),
)
cards = st.builds(
    lambda prefix_len, body: _luhn_complete(prefix_len[0] + body[: prefix_len[1] - len(prefix_len[0]) - 1]),
    st.sampled_from([("62", 19), ("62", 16), ("4", 16), ("51", 16), ("2221", 16), ("37", 15), ("3528", 16)]),
    digits(18),
)
passports = st.one_of(
    st.builds(lambda p, d: p + d, st.sampled_from(["E", "G"]), digits(8)),
    st.builds(lambda letter, d: "E" + letter + d, st.sampled_from("ABCDEFGHJKLMNPQRSTUVWXYZ"), digits(7)),
)
ipv4s = st.ip_addresses(v=4).map(str)
ipv6s = st.ip_addresses(v=6).map(str)

KINDS = {
    "email": emails,
    "phone": mobiles,
    "landline": landlines,
    "cn_id": st.one_of(id18s, id15s),
    "bank_card": cards,
    "passport": passports,
    "ipv4": ipv4s,
    "ipv6": ipv6s,
}


# Words that veto a kind on purpose when they come right before it ("订单号 6222…" is an order number).
VETO = {
    "bank_card": pii._NOT_CARD_WORDS,
    "cn_id": pii._NOT_CARD_WORDS,
    "ipv4": pii._VERSION_WORDS,
}


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_every_kind_is_redacted_between_chinese_text(kind: str) -> None:
    @settings(max_examples=150, deadline=None)
    @given(chinese, KINDS[kind], chinese)
    def check(left: str, value: str, right: str) -> None:
        assume(not any(word in left.lower() for word in VETO.get(kind, ())))
        text = left + value + right
        redacted = PiiRedactor(KEY).redact(text)
        assert value not in redacted.text, (kind, text, redacted.text)
        # One ambiguity by design: a 15-digit Amex number can also be a valid old ID number; it is
        # redacted either way.
        ambiguous = kind == "bank_card" and len(value) == 15 and redacted.counts == {"cn_id": 1}
        assert redacted.counts.get(kind) == 1 or ambiguous, (kind, text, redacted.text)
        # The Chinese text around it is untouched.
        assert redacted.text.startswith(left) and redacted.text.endswith(right)

    check()


def test_the_issue_example() -> None:
    text = "我的手机号13900001111，邮箱是bob.jones@example.org谢谢"
    redacted = PiiRedactor(KEY).redact(text)
    assert "13900001111" not in redacted.text and "bob.jones" not in redacted.text
    assert redacted.counts == {"phone": 1, "email": 1}
    assert redacted.text.startswith("我的手机号[PHONE:") and redacted.text.endswith("]谢谢")


@pytest.mark.parametrize(
    ("text", "value", "kind"),
    [
        ("座机010-62345678转", "010-62345678", "landline"),
        ("电话0755-1234567谢谢", "0755-1234567", "landline"),
        ("电话075512345678谢谢", "075512345678", "landline"),
        ("请拨(021)62345678找我", "(021)62345678", "landline"),
        ("老身份证110105491231002已作废", "110105491231002", "cn_id"),
        ("护照号E12345678，签证", "E12345678", "passport"),
        ("护照EA1234567到期", "EA1234567", "passport"),
        ("旧护照G12345678", "G12345678", "passport"),
        ("公务护照号码P1234567", "P1234567", "passport"),
        ("手机１３９００００１１１１谢谢", "１３９００００１１１１", "phone"),  # full-width digits
        ("卡号6222 0212 3456 7890 128请核对", "6222 0212 3456 7890 128", "bank_card"),
        ("我叫张伟，电话见上", "张伟", "name"),
        ("收货地址：北京市海淀区中关村大街27号，谢谢", "北京市海淀区中关村大街27号", "address"),
        ("IP:2001:db8::1 down", "2001:db8::1", "ipv6"),
    ],
)
def test_new_kinds_are_found(text: str, value: str, kind: str) -> None:
    redacted = PiiRedactor(KEY).redact(text)
    assert value not in redacted.text and redacted.counts == {kind: 1}, redacted.text


def test_old_and_new_id_numbers_share_a_pseudonym() -> None:
    redactor = PiiRedactor(KEY)
    # 110105491231002 is the 15-digit form of 11010519491231002X.
    old, new = redactor.redact("旧110105491231002").text, redactor.redact("新11010519491231002X").text
    assert old[1:] == new[1:]
    assert redactor.redact("010-62345678").text == redactor.redact("01062345678").text


@pytest.mark.parametrize(
    "text",
    [
        "客服热线400-820-8820，工商银行95588",
        "免费电话800-810-8888",
        "订单号4111111111111111已发货",  # Luhn-valid, but an order number
        "编号 1234567890123456 的商品",  # no issuer, no card word
        "下单时间2026-12-01 08:25:44，时间戳1764579944123",
        "升级到版本1.2.3.4后，v2.0.0.1 也可用",
        "金额¥13,900.00元，共1299.50美元",
        "型号SKU-G1234567X，零件号A12345678",
        "订单号110105491231002",  # a 15-digit order number that looks like an old ID
    ],
)
def test_look_alikes_next_to_chinese_are_left_alone(text: str) -> None:
    redacted = PiiRedactor(KEY).redact(text)
    assert redacted.text == text and redacted.counts == {}, redacted.text


@settings(max_examples=200, deadline=None)
@given(chinese, st.sampled_from(["400-820-8820", "95588", "2026-12-01", "v1.2.3", "¥1,299.00", "12:30"]), chinese)
def test_look_alikes_stay_between_chinese_text(left: str, value: str, right: str) -> None:
    text = left + value + right
    assert value in PiiRedactor(KEY).redact(text).text


def _random_order_numbers(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        length = rng.randint(13, 19)
        out.append(str(rng.randint(1, 9)) + "".join(rng.choice("0123456789") for _ in range(length - 1)))
    return out


def test_random_order_numbers_are_rarely_taken_for_bank_cards() -> None:
    """Luhn alone passes 1 in 10 random numbers (issue 12 measured 9.7% redacted); a card now
    also needs a card word or a real issuer prefix and length, and an order word vetoes it."""
    numbers = _random_order_numbers(5000, seed=12)
    redactor = PiiRedactor(KEY)
    luhn_rate = sum(luhn_valid(n) for n in numbers) / len(numbers)
    neutral = sum(redactor.redact(f"编码{n}结束").text != f"编码{n}结束" for n in numbers) / len(numbers)
    ordered = sum(redactor.redact(f"您的订单{n}已发货").text != f"您的订单{n}已发货" for n in numbers) / len(numbers)
    assert luhn_rate > 0.08  # what the Luhn-only redactor took for cards
    assert neutral <= 0.02, neutral  # measured 1.2% (20k numbers): Visa-like 4… numbers dominate
    assert ordered <= 0.002, ordered  # measured 0.02%


def test_cards_with_a_card_word_but_no_known_issuer_are_found() -> None:
    card = _luhn_complete("888812345678901")  # 16 digits, no scheme issues 8888
    redacted = PiiRedactor(KEY).redact(f"银行卡号{card}，尾号")
    assert card not in redacted.text and redacted.counts == {"bank_card": 1}
    assert PiiRedactor(KEY).redact(f"编码{card}").counts == {}


def test_placeholders_are_never_redacted_again() -> None:
    """A pseudonym can be all decimal digits (and even pass Luhn with a card prefix): text that is
    already redacted (the joiner redacts the gateway's audits again) must come back unchanged."""
    card_like = _luhn_complete("622202100112345")  # 16 digits, UnionPay prefix, valid Luhn
    text = f"卡号[BANK_CARD:{card_like}]，电话[PHONE:1390000111122223]"
    redacted = PiiRedactor(KEY).redact(text)
    assert redacted.text == text and redacted.counts == {}


def test_context_words_hold_after_characters_that_lower_case_longer() -> None:
    """``"İ".lower()`` is two characters: context must be read at the same offsets as the match."""
    card = _luhn_complete("888812345678901")  # found only through its card word
    text = "İİİİ银行卡号" + card
    assert card not in PiiRedactor(KEY).redact(text).text
