"""Response rules: the library shared by the bad-case joiner and the per-response rule checker.

Two kinds of question, one vocabulary of rule names (``RULES``):

* ``check_response(text)`` judges one answer on its own (the sequence-level consistency layer):
  amounts in 元 without two decimals, impossible dates, JSON that breaks the route's schema,
  compliance terms. It runs on every audited response.
* ``compare(response, correction)`` explains a user's correction: which numbers, units, dates or
  amounts changed, which compliance terms the user removed, whether the correction fixed a JSON
  violation. Its labels name the error categories that retraining groups by.

Text is split by ``tokenize``: every CJK character is a token (Chinese has no spaces, and a
one-character change such as 克 -> 千克 must show as one token), latin text by words, numbers
whole (``1,234.50`` is one token), other symbols one by one. Tokens keep character offsets so
diffs and spans point into the original text.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

import ahocorasick
import msgspec

# Rule names are also bad-case labels and retrain categories: keep them stable.
NUMBERS = "numbers"
UNITS = "units"
CURRENCY_FORMAT = "currency_format"
DATES = "dates"
JSON_SCHEMA = "json_schema"
COMPLIANCE = "compliance"
OTHER = "other"
RULES = (NUMBERS, UNITS, CURRENCY_FORMAT, DATES, JSON_SCHEMA, COMPLIANCE)

# A small built-in compliance lexicon (financial-service answers); deployments add their own
# through ENTROLOOP_COMPLIANCE_LEXICON. Matching is case-insensitive.
DEFAULT_COMPLIANCE_LEXICON: tuple[str, ...] = (
    "保证收益",
    "稳赚不赔",
    "零风险",
    "保本保息",
    "内幕消息",
    "guaranteed return",
    "risk-free",
    "no risk",
    "insider information",
)


class Token(msgspec.Struct, frozen=True, array_like=True):
    """One token and its character span ``[start, end)`` in the source text."""

    text: str
    start: int
    end: int


# CJK ideographs (incl. extension A and compatibility), kana, hangul: one token per character.
_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\uac00-\ud7af"
_TOKEN_RE = re.compile(
    rf"(?P<num>\d+(?:[,，]\d{{3}})*(?:\.\d+)?)"  # numbers, thousands separators kept inside
    rf"|(?P<cjk>[{_CJK}])"
    rf"|(?P<word>[^\W\d_{_CJK}]+(?:['’][^\W\d_{_CJK}]+)*)"  # latin (any script) words
    rf"|(?P<sym>[^\s])",
)


def tokenize(text: str) -> list[Token]:
    """Split CJK per character, latin by words, numbers whole, other symbols singly."""
    return [Token(m.group(), m.start(), m.end()) for m in _TOKEN_RE.finditer(text)]


# --- extraction ------------------------------------------------------------------------------

# Longest first so "千克" wins over "克" and "km" over "m".
_UNITS = sorted(
    [
        "kg", "g", "mg", "km", "m", "cm", "mm", "l", "ml", "kb", "mb", "gb", "tb", "ms", "s",
        "min", "h", "hz", "khz", "mhz", "ghz", "kw", "w", "v", "%", "℃", "°c", "°f",
        "公斤", "千克", "克", "毫克", "吨", "公里", "千米", "米", "厘米", "毫米", "升", "毫升",
        "元", "美元", "欧元", "港元", "万元", "亿元", "万", "亿", "个", "件", "次", "人",
        "天", "小时", "分钟", "秒", "年", "月", "日", "周", "岁", "度", "倍", "折",
    ],
    key=len,
    reverse=True,
)
_NUMBER_RE = re.compile(r"(?<![\d.])(\d+(?:[,，]\d{3})*(?:\.\d+)?)")
_UNIT_AFTER_RE = re.compile(
    r"\s*(" + "|".join(re.escape(u) for u in _UNITS) + r")(?![A-Za-z])", re.IGNORECASE
)
# An amount in yuan: optional ¥/￥ before, 元 after (or both). Group 1 is the number.
_YUAN_RE = re.compile(r"[¥￥]\s*(\d[\d,，]*(?:\.\d+)?)|(\d[\d,，]*(?:\.\d+)?)\s*元")
# The house format for amounts: thousands grouped by commas (optional), exactly two decimals.
_YUAN_OK = re.compile(r"^(?:\d{1,3}(?:,\d{3})+|\d+)\.\d{2}$")
_DATE_PATTERNS = (
    re.compile(r"(?<!\d)(\d{4})[-/.](\d{1,2})[-/.](\d{1,2})(?!\d)"),
    re.compile(r"(\d{4})\s*年\s*(\d{1,2})\s*月\s*(\d{1,2})\s*[日号]"),
)


def _norm_number(raw: str) -> str:
    """Canonical text of a number so 1,200.0 and 1200 compare equal."""
    cleaned = raw.replace(",", "").replace("，", "")
    try:
        value = float(cleaned)
    except ValueError:
        return cleaned
    return repr(value) if not value.is_integer() else str(int(value))


def _without_dates(text: str) -> str:
    """``text`` with dates blanked out, so a changed day counts as a date error, not a number one."""
    for pattern in _DATE_PATTERNS:
        text = pattern.sub(lambda m: " " * len(m.group()), text)
    return text


def numbers(text: str) -> list[str]:
    """Every number in ``text`` outside dates, normalised, in order."""
    return [_norm_number(m.group(1)) for m in _NUMBER_RE.finditer(_without_dates(text))]


def _plain_number_texts(text: str) -> list[str]:
    """Numbers outside dates and yuan amounts as written (separators dropped): 1234.00 -> 1234 is
    a numbers error (precision lost), while a yuan amount's decimals are the currency rule's job."""
    text = _YUAN_RE.sub(lambda m: " " * len(m.group()), _without_dates(text))
    return [m.group(1).replace(",", "").replace("，", "") for m in _NUMBER_RE.finditer(text)]


def quantities(text: str) -> list[tuple[str, str]]:
    """(number, unit) for every number followed by a known unit; unit lower-cased."""
    out = []
    text = _without_dates(text)
    for m in _NUMBER_RE.finditer(text):
        unit = _UNIT_AFTER_RE.match(text, m.end())
        if unit:
            out.append((_norm_number(m.group(1)), unit.group(1).lower()))
    return out


def yuan_amounts(text: str) -> list[str]:
    """Raw amount strings written with 元, ¥ or ￥."""
    return [m.group(1) or m.group(2) for m in _YUAN_RE.finditer(text)]


def bad_yuan_amounts(text: str) -> list[str]:
    """Amounts in yuan not written with exactly two decimals (e.g. ``12元``, ``3.5元``)."""
    return [a for a in yuan_amounts(text) if not _YUAN_OK.match(a.replace("，", ","))]


def dates(text: str) -> list[tuple[int, int, int]]:
    """(year, month, day) of every date written as 2024-03-05, 2024/3/5 or 2024年3月5日."""
    out = []
    for pattern in _DATE_PATTERNS:
        out.extend((int(y), int(m), int(d)) for y, m, d in pattern.findall(text))
    return out


def invalid_dates(text: str) -> list[tuple[int, int, int]]:
    """Dates that do not exist on the calendar (2024-02-30, 2023-13-01)."""
    bad = []
    for y, m, d in dates(text):
        try:
            dt.date(y, m, d)
        except ValueError:
            bad.append((y, m, d))
    return bad


class ComplianceLexicon:
    """Aho-Corasick automaton over the compliance terms: one pass per text whatever their number."""

    def __init__(self, terms: Iterable[str] = DEFAULT_COMPLIANCE_LEXICON) -> None:
        self._automaton = ahocorasick.Automaton()
        self.terms = sorted({t.lower() for t in terms if t.strip()})
        for term in self.terms:
            self._automaton.add_word(term, term)
        if self.terms:
            self._automaton.make_automaton()

    def find(self, text: str) -> list[tuple[int, int, str]]:
        """(start, end, term) of every match, case-insensitive, in order."""
        if not self.terms:
            return []
        lowered = text.lower()
        # lower() keeps length for the scripts the lexicon uses, so offsets stay valid; where it
        # does not (rare ligatures) the terms are still found, only offsets may shift.
        return [(end - len(t) + 1, end + 1, t) for end, t in self._automaton.iter(lowered)]

    def terms_in(self, text: str) -> Counter[str]:
        return Counter(t for _, _, t in self.find(text))


# --- JSON schema -----------------------------------------------------------------------------


def _first_json(text: str) -> tuple[Any, str] | None:
    """The JSON value a response carries: the whole text, or a fenced or first ``{...}`` block.

    Returns (value, "") or (None, reason) when the text claims to be JSON but does not parse;
    None when it does not look like JSON at all.
    """
    stripped = text.strip()
    fence = re.search(r"```(?:json)?\s*(.*?)```", stripped, re.DOTALL)
    candidate = fence.group(1).strip() if fence else stripped
    if not candidate.startswith(("{", "[")):
        start = candidate.find("{")
        if start < 0:
            return None
        candidate = candidate[start : candidate.rfind("}") + 1]
    try:
        return json.loads(candidate), ""
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON: {exc.msg} at {exc.pos}"


def json_schema_violations(text: str, schema: Mapping[str, Any]) -> list[str]:
    """Why ``text``'s JSON breaks ``schema`` (jsonschema, Draft 2020-12); [] when it conforms."""
    import jsonschema  # imported here: only routes with a schema pay for it

    found = _first_json(text)
    if found is None:
        return ["no JSON object in the response"]
    value, reason = found
    if reason:
        return [reason]
    validator = jsonschema.Draft202012Validator(schema)
    return [
        f"{'/'.join(map(str, e.absolute_path)) or '$'}: {e.message}" for e in validator.iter_errors(value)
    ]


# --- the two entry points --------------------------------------------------------------------


class Violation(msgspec.Struct, frozen=True):
    """One rule broken by one response."""

    rule: str
    detail: str
    start: int = -1
    end: int = -1


class ResponseRules:
    """The rule set, configured once: compliance lexicon and JSON schemas per route."""

    def __init__(
        self,
        lexicon: Iterable[str] = DEFAULT_COMPLIANCE_LEXICON,
        json_schemas: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> None:
        self.lexicon = ComplianceLexicon(lexicon)
        self.json_schemas = dict(json_schemas or {})

    def check_response(self, text: str, route: str = "default") -> list[Violation]:
        """Every rule ``text`` breaks on its own (no correction needed)."""
        out: list[Violation] = []
        for m in _YUAN_RE.finditer(text):
            amount = m.group(1) or m.group(2)
            if not _YUAN_OK.match(amount.replace("，", ",")):
                out.append(Violation(CURRENCY_FORMAT, f"amount {m.group()!r} needs two decimals", m.start(), m.end()))
        for y, mo, d in invalid_dates(text):
            out.append(Violation(DATES, f"no such date {y:04d}-{mo:02d}-{d:02d}"))
        schema = self.json_schemas.get(route)
        if schema is not None:
            out.extend(Violation(JSON_SCHEMA, reason) for reason in json_schema_violations(text, schema))
        for start, end, term in self.lexicon.find(text):
            out.append(Violation(COMPLIANCE, f"compliance term {term!r}", start, end))
        return out

    def compare(self, response: str, correction: str, route: str = "default") -> list[str]:
        """Labels explaining what the correction changed, in ``RULES`` order; [] if none applies."""
        labels: set[str] = set()
        if Counter(numbers(response)) != Counter(numbers(correction)) or Counter(
            _plain_number_texts(response)
        ) != Counter(_plain_number_texts(correction)):
            labels.add(NUMBERS)
        q_resp, q_corr = quantities(response), quantities(correction)
        # A unit error: the same number with another unit (5 克 -> 5 千克), or units changed while
        # the numbers stayed.
        units_resp = Counter(u for _, u in q_resp)
        units_corr = Counter(u for _, u in q_corr)
        if units_resp != units_corr:
            by_number_resp = {n: u for n, u in q_resp}
            if any(by_number_resp.get(n, u) != u for n, u in q_corr) or Counter(
                n for n, _ in q_resp
            ) == Counter(n for n, _ in q_corr):
                labels.add(UNITS)
        if bad_yuan_amounts(response) and not bad_yuan_amounts(correction):
            labels.add(CURRENCY_FORMAT)
        if Counter(dates(response)) != Counter(dates(correction)):
            labels.add(DATES)
        schema = self.json_schemas.get(route)
        if schema is not None and json_schema_violations(response, schema) and not json_schema_violations(
            correction, schema
        ):
            labels.add(JSON_SCHEMA)
        removed = self.lexicon.terms_in(response) - self.lexicon.terms_in(correction)
        if removed:
            labels.add(COMPLIANCE)
        return [r for r in RULES if r in labels]


__all__ = [
    "RULES",
    "NUMBERS",
    "UNITS",
    "CURRENCY_FORMAT",
    "DATES",
    "JSON_SCHEMA",
    "COMPLIANCE",
    "OTHER",
    "DEFAULT_COMPLIANCE_LEXICON",
    "Token",
    "tokenize",
    "numbers",
    "quantities",
    "yuan_amounts",
    "bad_yuan_amounts",
    "dates",
    "invalid_dates",
    "ComplianceLexicon",
    "json_schema_violations",
    "Violation",
    "ResponseRules",
]
