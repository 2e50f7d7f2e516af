"""PII redaction, applied before any free text leaves a serving node or reaches storage.

Shared infrastructure: the gateway and collectors redact prompts and answers with it, the bad-case
joiner (streams) redacts user corrections with it, and ``entroloop eval pii`` measures it. One
implementation, so the figure ``eval pii`` reports is the redaction that production applies.

Entities (``ENTITY_TYPES``):

- ``email``; ``phone`` (Chinese mobiles with or without ``+86``, ``+``-prefixed international
  numbers, North-American ``(555) 123-4567``; toll-free business lines such as 800-… are not
  personal and are left alone); ``landline`` (Chinese fixed lines with area code:
  ``010-62345678``, ``(0755)12345678``, ``075512345678``; service numbers such as 400-820-8820
  or 95588 have no area code and are left alone);
- ``cn_id``: resident identity numbers, 18 characters (GB 11643 check digit incl. ``X``) or the
  old 15-digit form, both with a real birth date and province code; a 15-digit number is
  normalised to its 18-digit form so both spellings of one person share a pseudonym;
- ``bank_card``: 13–19 digits passing Luhn **and** either a card word shortly before it
  (卡号, 银行卡, 尾号, card, …) or an issuer prefix and length that a real scheme issues
  (UnionPay 62, Visa 4, Mastercard 51–55 / 2221–2720, Amex 34/37, JCB 3528–3589, Discover,
  Diners, ICBC 9558); an order/tracking word nearer than any card word vetoes it. Luhn alone
  redacted ~10% of random order numbers;
- ``iban``: international bank account numbers (ISO 13616 mod-97 check);
- ``passport``: Chinese passports ``E12345678``, ``EA1234567``, ``G12345678`` anywhere; ``C``/``D``/
  ``S``/``P``/``H``/``M`` + 7–8 digits (travel permits, service passports) only next to a passport
  word such as 护照 / 通行证 / passport (alone they look like part numbers);
- ``ipv4`` (not after a version word: ``v1.2.3.4``), ``ipv6``;
- ``name`` and ``address``: only with evidence (a name after 我叫 / 姓名 / 联系人 / my name is …;
  a Chinese address with road, number and 号, or an English street address).

Why the look-arounds are written with explicit ASCII classes: Python's ``\\w`` and ``\\d`` match
CJK characters and other scripts' digits, so ``(?<!\\w)`` never fires in ``手机号13900001111``
and the number stayed in clear. Every pattern here is compiled with ``re.ASCII`` and bounded by
``[0-9A-Za-z]`` classes, so Chinese text on either side is just a boundary. Full-width digits
and letters (``１３９…``) are folded to ASCII for matching (same length, so offsets hold).

Each entity becomes ``[KIND:pseudonym]``, a keyed hash (HMAC-SHA256 with
``ENTROLOOP_PII_HASH_KEY``) of the normalised value: the same e-mail in the audit log and in a
correction gets the same pseudonym, so joins and diffs keep working, while without the key the
value cannot be recovered by hashing guesses. Redaction is idempotent (placeholders never match).

Pure standard library: no torch, no model.
"""

from __future__ import annotations

import bisect
import datetime as _dt
import hashlib
import hmac
import ipaddress
import logging
import os
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from entroloop.contract.settings import Settings, SettingsError

log = logging.getLogger(__name__)

PSEUDONYM_HEX_CHARS = 16  # 64 bits: collisions are negligible at audit-log scale

_CN_ID_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_CN_ID_CHECK = "10X98765432"
# GB/T 2260 province-level codes: the first two digits of every resident identity number.
_CN_PROVINCES = frozenset({
    "11", "12", "13", "14", "15", "21", "22", "23", "31", "32", "33", "34", "35", "36", "37", "41", "42", "43",
    "44", "45", "46", "50", "51", "52", "53", "54", "61", "62", "63", "64", "65", "71", "81", "82", "83", "91",
})

# Full-width ASCII digits and letters (common in Chinese input methods) -> ASCII, one char for one.
_FOLD = {cp: cp - 0xFEE0 for cp in (*range(0xFF10, 0xFF1A), *range(0xFF21, 0xFF3B), *range(0xFF41, 0xFF5B))}
_FOLD[0xFF20] = ord("@")
_ASCII_LOWER = {cp: cp + 32 for cp in range(ord("A"), ord("Z") + 1)}
_FULL_WIDTH = re.compile("[\uff10-\uff5a]")  # every character _FOLD maps (and a few it leaves)

_ALNUM_BEFORE = r"(?<![0-9A-Za-z])"
_ALNUM_AFTER = r"(?![0-9A-Za-z])"
_FLAGS = re.ASCII


def luhn_valid(digits: str) -> bool:
    """The Luhn checksum every payment card number carries in its last digit."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


def _real_date(year: int, month: int, day: int) -> bool:
    try:
        _dt.date(year, month, day)
    except ValueError:
        return False
    return True


def cn_id_valid(value: str) -> bool:
    """GB 11643-1999 identity number: province code, a real birth date and the check digit."""
    if len(value) != 18 or not value[:17].isdigit() or not value[:17].isascii():
        return False
    if value[:2] not in _CN_PROVINCES or not _real_date(int(value[6:10]), int(value[10:12]), int(value[12:14])):
        return False
    total = sum(int(c) * w for c, w in zip(value[:17], _CN_ID_WEIGHTS))
    return _CN_ID_CHECK[total % 11] == value[17].upper()


def cn_id15_valid(value: str) -> bool:
    """Old 15-digit identity number (before 1999): province code and a real 19YY birth date."""
    if len(value) != 15 or not value.isdigit() or not value.isascii():
        return False
    return value[:2] in _CN_PROVINCES and _real_date(1900 + int(value[6:8]), int(value[8:10]), int(value[10:12]))


def cn_id15_to_18(value: str) -> str:
    """The 18-digit form of a 15-digit number (century 19 inserted, check digit computed)."""
    body = value[:6] + "19" + value[6:]
    total = sum(int(c) * w for c, w in zip(body, _CN_ID_WEIGHTS))
    return body + _CN_ID_CHECK[total % 11]


def iban_valid(value: str) -> bool:
    """ISO 13616 check digits: the rearranged IBAN, letters as 10..35, is 1 modulo 97."""
    compact = value.replace(" ", "").upper()
    if not 15 <= len(compact) <= 34:
        return False
    rearranged = compact[4:] + compact[:4]
    return int("".join(str(int(ch, 36)) for ch in rearranged)) % 97 == 1


def _ipv6_valid(value: str) -> bool:
    try:
        ipaddress.IPv6Address(value)
    except ValueError:
        return False
    return True


def _digits(value: str) -> str:
    return re.sub(r"[^0-9]", "", value)


def _phone_key(digits: str) -> str:
    """One form per number, so ``+86 138 1234 5678`` and ``13812345678`` share a pseudonym."""
    if len(digits) == 13 and digits.startswith("861") and digits[3] in "3456789":
        return digits[2:]
    return digits


def _landline_key(value: str) -> str:
    """``+86 (10) 6234-5678``, ``010-62345678`` and ``01062345678`` -> ``01062345678``."""
    digits = _digits(value)
    if value.lstrip().startswith("+86") or (digits.startswith("86") and not digits.startswith("0")):
        digits = digits[2:]
    return digits if digits.startswith("0") else "0" + digits


# --- context words ---------------------------------------------------------------------------

_CONTEXT_WINDOW = 16  # characters before a candidate searched for a context word

_CARD_WORDS = (
    "卡号", "银行卡", "信用卡", "储蓄卡", "借记卡", "银联", "尾号", "账号", "帐号", "卡",
    "card", "visa", "mastercard", "amex", "unionpay", "account", "acct",
)
_NOT_CARD_WORDS = (
    "订单", "单号", "编号", "流水", "运单", "快递", "物流", "交易号", "工单", "发票", "序列号", "批次",
    "order", "tracking", "invoice", "serial", "ticket", "sku", "shipment", "transaction",
)
_ID_WORDS = ("身份证", "身份", "证号", "id", "identity")
_PASSPORT_WORDS = ("护照", "passport", "证件", "通行证", "旅行证", "permit")
_VERSION_WORDS = ("版本", "version", "ver", "build", "固件", "firmware", "release")


def _nearest(lowered: str, start: int, words: tuple[str, ...], window: int = _CONTEXT_WINDOW) -> int | None:
    """Distance from ``start`` back to the end of the nearest of ``words`` in the window, if any."""
    before = lowered[max(0, start - window) : start]
    best: int | None = None
    for word in words:
        at = before.rfind(word)
        if at >= 0:
            distance = len(before) - (at + len(word))
            best = distance if best is None else min(best, distance)
    return best


def _card_issuer_plausible(digits: str) -> bool:
    """A prefix and length that a card scheme actually issues."""
    n, p2, p4 = len(digits), int(digits[:2]), int(digits[:4])
    return (
        (digits[0] == "4" and n in (13, 16, 19))  # Visa
        or (51 <= p2 <= 55 and n == 16)  # Mastercard
        or (2221 <= p4 <= 2720 and n == 16)  # Mastercard 2-series
        or (p2 in (34, 37) and n == 15)  # American Express
        or (p2 == 62 and 16 <= n <= 19)  # UnionPay
        or (3528 <= p4 <= 3589 and 16 <= n <= 19)  # JCB
        or ((p4 == 6011 or p2 == 65 or 644 <= int(digits[:3]) <= 649) and 16 <= n <= 19)  # Discover
        or ((300 <= int(digits[:3]) <= 305 or p2 in (36, 38, 39)) and 14 <= n <= 16)  # Diners
        or (p4 == 9558 and n == 19)  # ICBC domestic
        or (p2 == 60 and 16 <= n <= 19)  # Chinese domestic debit (e.g. 601382)
    )


def _bank_card_valid(raw: str, lowered: str, start: int) -> bool:
    digits = _digits(raw)
    if not 13 <= len(digits) <= 19 or not luhn_valid(digits):
        return False
    card = _nearest(lowered, start, _CARD_WORDS)
    other = _nearest(lowered, start, _NOT_CARD_WORDS)
    if other is not None and (card is None or other < card):
        return False  # "订单号 4…": an order number, even when it happens to look like a card
    return card is not None or _card_issuer_plausible(digits)


def _ipv4_valid(raw: str, lowered: str, start: int) -> bool:
    """Four dotted numbers right after a version word (or ``v1.2.3.4``) are a version."""
    if start and lowered[start - 1] == "v" and not (start > 1 and lowered[start - 2].isalpha()):
        return False
    distance = _nearest(lowered, start, _VERSION_WORDS, window=12)
    return distance is None or distance > 3  # "版本号：1.2.3.4", "version 4.2.1.0"


def _cn_id15_valid(raw: str, lowered: str, start: int) -> bool:
    """A 15-digit number has no check digit: an order word nearer than an ID word vetoes it."""
    if not cn_id15_valid(raw):
        return False
    other = _nearest(lowered, start, _NOT_CARD_WORDS)
    ident = _nearest(lowered, start, _ID_WORDS)
    return other is None or (ident is not None and ident < other)


def _passport_valid(raw: str, lowered: str, start: int) -> bool:
    if raw[0] in "EeGg":
        return True
    return _nearest(lowered, start, _PASSPORT_WORDS, window=12) is not None


_NORTH_AMERICAN_TOLL_FREE = ("800", "833", "844", "855", "866", "877", "888", "400")


def _phone_valid(raw: str, lowered: str, start: int) -> bool:
    digits = _digits(raw)
    if not 7 <= len(digits) <= 15:
        return False
    # a business line (800-…, 400-820-8820) is not a person's number
    return raw.startswith("+") or len(digits) != 10 or digits[:3] not in _NORTH_AMERICAN_TOLL_FREE


# --- detectors -------------------------------------------------------------------------------

_HAN = "\u3400-\u4dbf\u4e00-\u9fff"
_SURNAMES = (
    "王李张刘陈杨黄赵吴周徐孙马朱胡郭何高林罗郑梁谢宋唐许韩冯邓曹彭曾肖田董袁潘于蒋蔡余杜叶程苏魏吕丁任"
    "沈姚卢姜崔钟谭陆汪范金石廖贾夏韦付方白邹孟熊秦邱江尹薛闫段雷侯龙史陶黎贺顾毛郝龚邵万钱严覃武戴莫孔向汤"
)


_NAME_CONTEXT_ZH = "我叫|我的名字是|我是|姓名|名字|联系人|收件人|收货人|持卡人|患者|客户|寄给|发给|交给|转交"
_NAME_CONTEXT = _NAME_CONTEXT_ZH + "|name is|name:|contact:|cardholder:|signed"


@dataclass(frozen=True)
class _Detector:
    kind: str
    pattern: re.Pattern[str]
    normalise: Callable[[str], str]
    # (matched value, lower-cased folded text, start) -> keep? Context rules read the text before.
    valid: Callable[[str, str, int], bool] = lambda _v, _t, _s: True
    # Words a match may start with that are not part of the entity (住在 before an address).
    lead_in: re.Pattern[str] | None = None
    # A cheap search that must succeed before the (slower, context-driven) pattern runs at all.
    needs: re.Pattern[str] | None = None


def _simple(check: Callable[[str], bool]) -> Callable[[str, str, int], bool]:
    return lambda value, _text, _start: check(value)


# ``needs``: what every match of a detector's pattern contains, found in one cheap search. Each
# skips a pattern that costs 1-3 µs on a short answer; most answers hold no e-mail, ID number or
# address, and the gateway redacts every prompt and answer. A needs that a match could lack would
# leak that match: each is the pattern's own literal core (tests/unit/entroloop/test_pii_needs.py).
_FIFTEEN_DIGITS = re.compile(r"[0-9]{15}", _FLAGS)  # both ID forms: 15 or 17 digits in a row

# Order = priority when two candidates overlap (an ID number contains card-like digit runs).
_DETECTORS: tuple[_Detector, ...] = (
    _Detector(
        "email",
        re.compile(
            r"(?<![A-Za-z0-9._%+-])[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}(?![A-Za-z0-9-])",
            _FLAGS,
        ),
        str.lower,
        needs=re.compile("@"),
    ),
    _Detector(
        "cn_id",
        re.compile(
            _ALNUM_BEFORE + r"[1-9][0-9]{5}(?:18|19|20)[0-9]{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12][0-9]|3[01])[0-9]{3}[0-9Xx]"
            + _ALNUM_AFTER,
            _FLAGS,
        ),
        str.upper,
        _simple(cn_id_valid),
        needs=_FIFTEEN_DIGITS,
    ),
    _Detector(
        "cn_id",
        re.compile(
            _ALNUM_BEFORE + r"[1-9][0-9]{5}[0-9]{2}(?:0[1-9]|1[0-2])(?:0[1-9]|[12][0-9]|3[01])[0-9]{3}" + _ALNUM_AFTER,
            _FLAGS,
        ),
        cn_id15_to_18,
        _cn_id15_valid,
        needs=_FIFTEEN_DIGITS,
    ),
    _Detector(
        "iban",
        re.compile(_ALNUM_BEFORE + r"[A-Z]{2}[0-9]{2}(?: ?[A-Z0-9]{4}){2,7}(?: ?[A-Z0-9]{1,4})?" + _ALNUM_AFTER, _FLAGS),
        lambda v: v.replace(" ", "").upper(),
        _simple(iban_valid),
        needs=re.compile(r"[A-Z]{2}[0-9]{2}", _FLAGS),
    ),
    _Detector(
        "bank_card",
        re.compile(r"(?<![0-9A-Za-z+-])[0-9](?:[ -]?[0-9]){12,18}(?![0-9A-Za-z]|-[0-9])", _FLAGS),
        _digits,
        _bank_card_valid,
    ),
    _Detector(
        "passport",
        re.compile(_ALNUM_BEFORE + r"(?:[EeGg][0-9]{8}|[Ee][A-HJ-NP-Za-hj-np-z][0-9]{7}|[CDSPHMcdsphm][0-9]{7,8})"
                   + _ALNUM_AFTER, _FLAGS),
        str.upper,
        _passport_valid,
        needs=re.compile(r"[A-Za-z][0-9]{7}", _FLAGS),  # every form: a letter, then 7 digits
    ),
    _Detector(
        "ipv6",
        re.compile(
            # Either not after hex/colon/dot, or right after a label's colon ("IP:2001:db8::1").
            r"(?:(?<![0-9A-Fa-f:.])(?!:[0-9A-Fa-f])|(?<=[^0-9A-Fa-f:.]:)(?=[0-9A-Fa-f]))"
            r"(?:[0-9A-Fa-f]{0,4}:){2,7}(?:(?:[0-9]{1,3}\.){3}[0-9]{1,3}|[0-9A-Fa-f]{1,4})?"
            r"(?![0-9A-Fa-f:]|\.[0-9])",
            _FLAGS,
        ),
        lambda v: ipaddress.IPv6Address(v).compressed,
        _simple(_ipv6_valid),
        needs=re.compile(r":[0-9A-Fa-f]{0,4}:", _FLAGS),  # two groups: two colons at most 4 hex apart
    ),
    _Detector(
        "ipv4",
        re.compile(
            r"(?<![0-9.])(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
            r"(?!\.?[0-9])",
            _FLAGS,
        ),
        str,
        _ipv4_valid,
        needs=re.compile(r"[0-9]\.[0-9]{1,3}\.[0-9]", _FLAGS),
    ),
    _Detector(
        "landline",
        re.compile(
            r"(?<![0-9A-Za-z+])(?:(?:\+|00)?86[ -]?)?"
            r"(?:\(0(?:10|2[0-9]|[3-9][0-9]{2})\)[ -]?|0(?:10|2[0-9]|[3-9][0-9]{2})[ -]?)"
            r"[1-9][0-9]{2,3}[ -]?[0-9]{4}" + _ALNUM_AFTER,
            _FLAGS,
        ),
        _landline_key,
        _simple(lambda v: 9 <= len(_digits(v)) <= 14),
    ),
    _Detector(
        "phone",
        re.compile(
            r"(?<![0-9A-Za-z+])(?:"
            r"(?:(?:\+|00)?86[ -]?)?1[3-9][0-9](?:[ -]?[0-9]{4}){2}"  # Chinese mobile, optionally +86
            r"|\+[0-9]{1,3}(?:[ .-]?\(?[0-9]{1,4}\)?){2,5}"  # international, E.164-like with +
            r"|\(?[0-9]{3}\)?[ .-][0-9]{3}[ .-][0-9]{4}"  # North American
            r")" + _ALNUM_AFTER,
            _FLAGS,
        ),
        lambda v: _phone_key(_digits(v)),
        _phone_valid,
    ),
    _Detector(
        "address",
        re.compile(
            rf"(?:[{_HAN}]{{2,7}}?(?:省|自治区|市))?[{_HAN}]{{1,8}}?(?:市|区|县|镇)"
            rf"[{_HAN}0-9]{{1,12}}?(?:路|街|大道|道|巷|胡同|弄)(?:[一二三四五六七八九十]{{1,3}}段)?[0-9]{{1,5}}号"
            rf"(?:[0-9]{{1,4}}(?:号楼|栋|幢|单元|室|层|楼))*"
            r"|(?<![0-9A-Za-z])[0-9]{1,5}[A-Za-z]? (?:[A-Z][a-z]+ ){1,3}"
            r"(?:Street|St|Road|Rd|Avenue|Ave|Lane|Ln|Drive|Dr|Boulevard|Blvd|Way|Court|Ct|Place|Pl|Parkway|Pkwy"
            r"|Highway|Hwy|Square|Sq|Terrace|Circle|Cir|Trail)\b\.?",
            _FLAGS,
        ),
        str,
        lead_in=re.compile(r"(?:我|他|她|我们)?(?:现在)?(?:家住|住在|住|寄到|送到|发到|位于|地址是|在)"),
        needs=re.compile(r"[0-9]号|[0-9][A-Za-z]? [A-Z]", _FLAGS),
    ),
    _Detector(
        "name",
        re.compile(
            rf"(?:{_NAME_CONTEXT_ZH})[:：]?\s?"
            # Where a name ends inside Chinese text is unknowable: take two given-name characters
            # unless a title follows the first (over-redacting one character beats leaking one).
            rf"(?P<v>(?:欧阳|司马|上官|诸葛|[{_SURNAMES}])(?:[{_HAN}](?=先生|女士|小姐|老师|同学|[^{_HAN}]|$)|[{_HAN}]{{1,2}}))"
            r"|(?:[Mm]y name is|[Nn]ame:|[Cc]ontact:|[Cc]ardholder:|[Ss]igned,?)\s+"
            r"(?P<e>[A-Z][a-z]+(?: [A-Z][a-z]+){0,2})",
            _FLAGS,
        ),
        str,
        needs=re.compile(_NAME_CONTEXT, _FLAGS | re.IGNORECASE),
    ),
)

ENTITY_TYPES: tuple[str, ...] = tuple(dict.fromkeys(d.kind for d in _DETECTORS))
_PLACEHOLDER = re.compile(rf"\[[A-Z0-9_]+:[0-9a-f]{{{PSEUDONYM_HEX_CHARS}}}\]")


@dataclass(frozen=True)
class Redacted:
    """A redacted text and how many entities of each type it contained."""

    text: str
    counts: dict[str, int] = field(default_factory=dict)


class PiiRedactor:
    """Replaces PII with keyed pseudonyms. Thread-safe (no mutable state)."""

    def __init__(self, key: bytes | str | None) -> None:
        """``key=None``: a random per-process key (pseudonyms then join only within this process)."""
        self.ephemeral = key is None or key == b"" or key == ""
        if self.ephemeral:
            key = os.urandom(32)
        assert key is not None
        self._key = key.encode() if isinstance(key, str) else key

    @classmethod
    def from_settings(cls, settings: Settings) -> PiiRedactor:
        """Keyed by ENTROLOOP_PII_HASH_KEY; empty means a random key, which breaks cross-node joins."""
        return cls(settings.pii_hash_key.get_secret_value() or None)

    def pseudonym(self, kind: str, value: str) -> str:
        """Keyed hash of a normalised value, domain-separated by entity type."""
        mac = hmac.new(self._key, f"{kind}\x00{value}".encode(), hashlib.sha256)
        return mac.hexdigest()[:PSEUDONYM_HEX_CHARS]

    def pseudonymise_user(self, user_id: str) -> str:
        """The pseudonymous user id carried by Audit and Feedback records."""
        return self.pseudonym("user", user_id) if user_id else ""

    def find(self, text: str) -> list[tuple[int, int, str, str]]:
        """Validated, non-overlapping entities as (start, end, kind, normalised value)."""
        # Both translations walk the text char by char through a dict (~2 µs each on a short answer):
        # skipped when they cannot change anything.
        folded = text.translate(_FOLD) if _FULL_WIDTH.search(text) else text
        # str.lower() may change the length ("İ") or fold other scripts: only on ASCII is it the same.
        lowered = folded.lower() if folded.isascii() else folded.translate(_ASCII_LOWER)
        # Earlier placeholders are never matched again (a pseudonym can be all decimal digits), so
        # redacting already-redacted text — the joiner redacts the gateway's audits — changes nothing.
        taken: list[tuple[int, int, str, str]] = [(m.start(), m.end(), "", "") for m in _PLACEHOLDER.finditer(folded)]
        # The spans taken so far are disjoint, so sorted by start they are sorted by end too: the one
        # with the greatest start before a candidate's end is the only one that can overlap it. A
        # bisect keeps a prompt dense in PII linear-logarithmic (a scan of every earlier span made a
        # 1.4 MB prompt take minutes).
        starts = [t[0] for t in taken]
        ends = [t[1] for t in taken]
        for detector in _DETECTORS:
            if detector.needs is not None and detector.needs.search(folded) is None:
                continue
            for match in detector.pattern.finditer(folded):
                group = next((g for g in ("v", "e") if g in match.re.groupindex and match.group(g)), None)
                start, end = match.span(group) if group else match.span()
                if detector.lead_in is not None and (lead := detector.lead_in.match(folded, start, end)):
                    start = lead.end()
                    if start >= end:
                        continue
                raw = folded[start:end]
                before = bisect.bisect_left(starts, end) - 1
                if before >= 0 and ends[before] > start:
                    continue
                if not detector.valid(raw, lowered, start):
                    continue
                taken.append((start, end, detector.kind, detector.normalise(raw)))
                starts.insert(before + 1, start)
                ends.insert(before + 1, end)
        found = sorted(t for t in taken if t[2])
        return found

    def redact(self, text: str) -> Redacted:
        """Replace every entity by ``[KIND:pseudonym]``; count entities per kind."""
        entities = self.find(text)
        if not entities:
            return Redacted(text, {})
        parts: list[str] = []
        counts: Counter[str] = Counter()
        cursor = 0
        for start, end, kind, value in entities:
            parts.append(text[cursor:start])
            parts.append(f"[{kind.upper()}:{self.pseudonym(kind, value)}]")
            counts[kind] += 1
            cursor = end
        parts.append(text[cursor:])
        return Redacted("".join(parts), dict(counts))

    def redact_text(self, text: str) -> str:
        """Just the redacted text (for free-text fields whose counts nobody keeps)."""
        return self.redact(text).text if text else text


PII_KEY_VARIABLE = "ENTROLOOP_PII_HASH_KEY"
PII_KEY_FIX = (
    f"set {PII_KEY_VARIABLE} to one random secret shared by every gateway and stream worker, e.g. "
    f"`export {PII_KEY_VARIABLE}=$(openssl rand -base64 32)`, or put it in a file named by "
    f"{PII_KEY_VARIABLE}_FILE"
)


def redactor_for_service(settings: Settings, service: str, refuse_in_production: bool = True) -> PiiRedactor:
    """The redactor a long-running service uses, refusing or warning when it has no key.

    Without ``ENTROLOOP_PII_HASH_KEY`` each process draws a random key: pseudonyms then differ
    between gateways, restarts and the bad-case joiner, so audit joins by user and correction
    diffs silently break. With ``refuse_in_production`` (the gateway, where user data enters)
    ``ENTROLOOP_MODE=production`` refuses to start (``SettingsError`` naming the variable and the
    fix); otherwise the service goes on with a loud warning (text is still redacted, only the
    pseudonyms stop matching other processes').
    """
    redactor = PiiRedactor.from_settings(settings)
    if redactor.ephemeral:
        mode = getattr(settings, "mode", "demo")
        if mode == "production" and refuse_in_production:
            raise SettingsError(
                f"{service}: {PII_KEY_VARIABLE} is empty, and ENTROLOOP_MODE=production refuses to start "
                f"without a pseudonymisation key (a random per-process key makes pseudonyms differ between "
                f"processes and restarts); {PII_KEY_FIX}"
            )
        if service not in _WARNED_WITHOUT_KEY:  # once per service and process: a benchmark or a
            _WARNED_WITHOUT_KEY.add(service)    # test builds the same processor many times
            log.warning(
                "%s: %s is not set (ENTROLOOP_MODE=%s): PII pseudonyms use a random key of this process "
                "only, so they will not join across processes or restarts; %s",
                service, PII_KEY_VARIABLE, mode, PII_KEY_FIX,
            )
    return redactor


_WARNED_WITHOUT_KEY: set[str] = set()


__all__ = [
    "ENTITY_TYPES",
    "PII_KEY_FIX",
    "PII_KEY_VARIABLE",
    "PiiRedactor",
    "Redacted",
    "cn_id15_to_18",
    "cn_id15_valid",
    "cn_id_valid",
    "iban_valid",
    "luhn_valid",
    "redactor_for_service",
]
