"""What a user's correction changed, in the bad-case label vocabulary (``entroloop.streams.rules.LABELS``).

The labels separate *what kind of span* changed from *whether the meaning changed*:

* ``number``: a numeric value (outside dates) changed: 500 -> 600, 1.5万 -> 2万. Never for a
  format-only change (always comes with ``fact``).
* ``fact``: the content changed, not just its form: a different value, entity, claim, unit or
  date. Decided on a normalised form of both texts (dates, numbers and units canonical; case,
  width, spacing and punctuation ignored), so 500元 -> ¥500.00 is not a fact change.
* ``amount_format``: a number kept its value but is written otherwise (12元 -> 12.00元,
  1,000 -> 1000, 1.5万元 -> 15000.00元, ¥500 -> 500元), or a yuan amount without two decimals was
  fixed.
* ``unit``: a quantity's unit changed (5克 -> 5千克: also ``fact``), was added or dropped, or is
  written otherwise (5公斤 -> 5 kg: ``unit`` alone).
* ``date``: a date changed or was invalid (also ``fact``), or is written otherwise (2024年3月5日 ->
  2024-03-05: ``date`` alone).
* ``json_schema``: the correction is JSON and the output is not, or its keys or value types differ;
  or the route's configured schema is broken by the output and met by the correction.
* ``compliance``: the correction removed a compliance term or paraphrase (lexicon and patterns,
  configurable, shared with the per-response rules).

Why not a plain token diff: a diff says *where* the texts differ, not whether the difference is a
reformatting (the house style, fixed by a formatter) or a wrong answer (what retraining is for).
"""

from __future__ import annotations

import functools

import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

import msgspec
from entroloop.streams.rules import (
    AMOUNT_FORMAT,
    COMPLIANCE,
    DATE,
    FACT,
    JSON_SCHEMA,
    LABELS,
    NUMBER,
    UNIT,
    ComplianceLexicon,
    _first_json,
    bad_yuan_amounts,
    date_spans,
    invalid_dates,
    json_schema_violations,
    tokenize,
    without_dates,
)

# Written unit -> canonical unit. Currencies canonicalise to ISO codes and are compared as amount
# formats (¥500 vs 500元), not as units, unless the currency itself changed.
_UNIT_CANON: dict[str, str] = {
    **dict.fromkeys(["kg", "kgs", "公斤", "千克", "kilogram", "kilograms"], "kg"),
    **dict.fromkeys(["g", "克", "gram", "grams"], "g"),
    **dict.fromkeys(["mg", "毫克", "milligram", "milligrams"], "mg"),
    **dict.fromkeys(["吨", "ton", "tons", "tonne", "tonnes"], "t"),
    **dict.fromkeys(["lb", "lbs", "pound", "pounds", "磅"], "lb"),
    **dict.fromkeys(["km", "公里", "千米", "kilometer", "kilometers", "kilometre", "kilometres"], "km"),
    **dict.fromkeys(["m", "米", "meter", "meters", "metre", "metres"], "m"),
    **dict.fromkeys(["cm", "厘米", "centimeter", "centimeters"], "cm"),
    **dict.fromkeys(["mm", "毫米", "millimeter", "millimeters"], "mm"),
    **dict.fromkeys(["mile", "miles", "英里"], "mile"),
    **dict.fromkeys(["l", "升", "liter", "liters", "litre", "litres"], "l"),
    **dict.fromkeys(["ml", "毫升", "milliliter", "milliliters"], "ml"),
    **dict.fromkeys(["kb"], "kb"), **dict.fromkeys(["mb"], "mb"), **dict.fromkeys(["gb"], "gb"),
    **dict.fromkeys(["tb"], "tb"),
    **dict.fromkeys(["ms", "毫秒", "millisecond", "milliseconds"], "ms"),
    **dict.fromkeys(["s", "sec", "secs", "秒", "秒钟", "second", "seconds"], "s"),
    **dict.fromkeys(["min", "mins", "分钟", "minute", "minutes"], "min"),
    **dict.fromkeys(["h", "hr", "hrs", "小时", "个小时", "hour", "hours"], "h"),
    **dict.fromkeys(["天", "日", "day", "days"], "day"),
    **dict.fromkeys(["个工作日", "工作日", "business day", "business days", "working days"], "workday"),
    **dict.fromkeys(["周", "星期", "个星期", "week", "weeks"], "week"),
    **dict.fromkeys(["个月", "month", "months"], "month"),
    **dict.fromkeys(["年", "year", "years"], "year"),
    **dict.fromkeys(["岁", "years old"], "age"),
    **dict.fromkeys(["℃", "°c", "摄氏度"], "degc"), **dict.fromkeys(["°f", "华氏度"], "degf"),
    **dict.fromkeys(["度"], "deg"),
    **dict.fromkeys(["%", "percent", "个百分点"], "%"),
    **dict.fromkeys(["倍", "times"], "x"), **dict.fromkeys(["折"], "折"),
    **dict.fromkeys(["kw", "千瓦"], "kw"), **dict.fromkeys(["w", "瓦"], "w"), **dict.fromkeys(["v", "伏"], "v"),
    **dict.fromkeys(["hz"], "hz"), **dict.fromkeys(["khz"], "khz"), **dict.fromkeys(["mhz"], "mhz"),
    **dict.fromkeys(["ghz"], "ghz"),
    **dict.fromkeys(["个"], "个"), **dict.fromkeys(["件"], "件"), **dict.fromkeys(["次"], "次"),
    **dict.fromkeys(["人", "名"], "人"), **dict.fromkeys(["张"], "张"), **dict.fromkeys(["台"], "台"),
    **dict.fromkeys(["元", "块", "块钱", "元人民币", "人民币", "rmb", "cny", "yuan"], "CNY"),
    **dict.fromkeys(["美元", "usd", "dollar", "dollars"], "USD"),
    **dict.fromkeys(["欧元", "eur", "euro", "euros"], "EUR"),
    **dict.fromkeys(["港元", "港币", "hkd"], "HKD"),
    **dict.fromkeys(["英镑", "gbp"], "GBP"),
}
_CURRENCIES = {"CNY", "USD", "EUR", "HKD", "GBP"}
_PREFIX_CURRENCY = {"¥": "CNY", "￥": "CNY", "rmb": "CNY", "cny": "CNY", "$": "USD", "us$": "USD",
                    "usd": "USD", "€": "EUR", "eur": "EUR", "hk$": "HKD", "£": "GBP", "gbp": "GBP"}
_MULTIPLIERS = {"万": Decimal(10_000), "亿": Decimal(100_000_000), "千": Decimal(1_000),
                "百万": Decimal(1_000_000), "千万": Decimal(10_000_000),
                "thousand": Decimal(1_000), "million": Decimal(1_000_000), "billion": Decimal(1_000_000_000),
                "k": Decimal(1_000)}


def _alternation(words: Iterable[str]) -> str:
    return "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))


# A match starts with a digit or a currency mark's first character: the lookahead lets every other
# position fail on one character class instead of trying each currency mark (half the scan's time).
_QUANTITY_FIRST = "".join(sorted({re.escape(mark[0]) for mark in _PREFIX_CURRENCY}))
_QUANTITY_RE = re.compile(
    rf"(?=[\d{_QUANTITY_FIRST}])"
    rf"(?P<pre>(?:{_alternation(_PREFIX_CURRENCY)})\s*)?"
    r"(?<![\d.])(?P<num>\d+(?:[,，]\d{3})*(?:\.\d+)?)"
    r"(?:\s*(?P<mul>百万|千万|万|亿|千(?![克米瓦])|thousand|million|billion|k)(?![a-z]))?"
    rf"(?:\s*(?P<unit>{_alternation(_UNIT_CANON)})(?![a-z]))?",
    re.IGNORECASE,
)


class Quantity(msgspec.Struct, frozen=True):
    """A number as written, with its value (multiplier applied) and canonical unit."""

    start: int
    end: int
    raw: str  # the number and its multiplier as written, separators kept: "1,000", "1.5万"
    value: Decimal
    unit: str  # canonical ("kg", "CNY"); "" when none
    unit_text: str  # the unit as written, lower-cased ("公斤", "¥"); "" when none


def quantities_in(text: str) -> list[Quantity]:
    """Every number outside dates, with multiplier (万, million) and unit or currency, in order."""
    return list(_quantities_in(text))


@functools.lru_cache(maxsize=64)
def _quantities_in(text: str) -> tuple[Quantity, ...]:
    # Cached like rules._date_spans, for the same reason: one bad case asks for the numbers of its
    # response and correction five times (labels, content tokens, the minimal failing example).
    blanked = without_dates(text)
    out = []
    for m in _QUANTITY_RE.finditer(blanked):
        number = m.group("num").replace(",", "").replace("，", "")
        try:
            value = Decimal(number)
        except InvalidOperation:
            continue
        mul = (m.group("mul") or "").lower()
        if mul:
            value *= _MULTIPLIERS[mul]
        pre = (m.group("pre") or "").strip().lower()
        unit_text = (m.group("unit") or "").lower()
        unit = _UNIT_CANON.get(unit_text, "") or _PREFIX_CURRENCY.get(pre, "")
        raw = m.group("num") + (m.group("mul") or "")
        out.append(Quantity(m.start(), m.end(), raw, value.normalize(), unit, unit_text or pre))
    return tuple(out)


# --- content (the "fact" test) --------------------------------------------------------------


def content_tokens(text: str) -> Counter[str]:
    """The text's meaning-bearing tokens: dates and quantities canonical, words lower-cased, CJK
    characters, punctuation and spacing dropped. Equal counters: the change was form only."""
    text = unicodedata.normalize("NFKC", text)
    out: Counter[str] = Counter()
    spans: list[tuple[int, int, str]] = [(s, e, "date:{}-{}-{}".format(*ymd)) for s, e, ymd in date_spans(text)]
    spans += [(q.start, q.end, f"q:{q.value}:{q.unit}") for q in quantities_in(text)]
    pieces = []
    cursor = 0
    for start, end, canon in sorted(spans):
        if start < cursor:
            continue
        pieces.append(text[cursor:start])
        out[canon] += 1
        cursor = end
    pieces.append(text[cursor:])
    out.update([token.text.lower() for token in tokenize(" ".join(pieces))
                if token.text.isalnum() or any(ch.isalpha() for ch in token.text)])
    return out


# --- JSON -----------------------------------------------------------------------------------


def _json_value(text: str) -> tuple[bool, Any]:
    """(True, value) when the text carries a JSON object or array (whole, fenced or embedded)."""
    found = _first_json(text)
    if found is None or found[1]:
        return False, None
    value = found[0]
    return isinstance(value, (dict, list)), value


def _shape(value: Any, path: str = "$") -> set[tuple[str, str]]:
    """(path, type) of every node; list items share one path, ints and floats are both numbers."""
    if isinstance(value, dict):
        out = {(path, "object")}
        for key, item in value.items():
            out |= _shape(item, f"{path}.{key}")
        return out
    if isinstance(value, list):
        out = {(path, "array")}
        for item in value:
            out |= _shape(item, f"{path}[]")
        return out
    kind = {bool: "boolean", type(None): "null", str: "string"}.get(type(value), "number")
    return {(path, kind)}


def _leaves(value: Any) -> list[Any]:
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    if isinstance(value, list):
        return [leaf for item in value for leaf in _leaves(item)]
    return [value]


def _leaf_tokens(value: Any) -> Counter[str]:
    """content_tokens of every leaf value (keys are structure, not content)."""
    out: Counter[str] = Counter()
    for leaf in _leaves(value):
        if leaf is None or isinstance(leaf, bool):
            out[str(leaf).lower()] += 1
        else:
            out += content_tokens(str(leaf))
    return out


# --- the labeller ---------------------------------------------------------------------------


def label_correction(
    response: str,
    correction: str,
    lexicon: ComplianceLexicon,
    schema: Mapping[str, Any] | None = None,
) -> list[str]:
    """Labels for what ``correction`` changed in ``response``, in ``LABELS`` order ([]: none)."""
    labels: set[str] = set()
    resp_is_json, resp_json = _json_value(response)
    corr_is_json, corr_json = _json_value(correction)
    restructured = corr_is_json and not resp_is_json  # free text turned into JSON

    if (schema is not None and json_schema_violations(response, schema)
            and not json_schema_violations(correction, schema)):
        labels.add(JSON_SCHEMA)
    if corr_is_json and (not resp_is_json or _shape(resp_json) != _shape(corr_json)):
        labels.add(JSON_SCHEMA)

    # A number inside a compliance phrase (100%赔付, "100% guaranteed") is part of the claim, which
    # the compliance label covers, not a value the user corrected.
    q_resp = _outside(quantities_in(response), lexicon.find(response))
    q_corr = _outside(quantities_in(correction), lexicon.find(correction))
    if restructured:
        # Keys and layout are new; judge only whether the JSON's values are in the text.
        values_resp = Counter(q.value for q in q_resp)
        if Counter(q.value for q in q_corr) - values_resp:
            labels.add(NUMBER)
        if _unitless(_leaf_tokens(corr_json)) - _unitless(content_tokens(response)):
            labels.add(FACT)
    else:
        labels |= _quantity_labels(q_resp, q_corr)
        if bad_yuan_amounts(response) and not bad_yuan_amounts(correction):
            labels.add(AMOUNT_FORMAT)
        if corr_is_json and resp_is_json:
            if _leaf_tokens(resp_json) != _leaf_tokens(corr_json):
                labels.add(FACT)
        elif content_tokens(response) != content_tokens(correction):
            labels.add(FACT)

    d_resp, d_corr = date_spans(response), date_spans(correction)
    if [ymd for *_, ymd in d_resp] != [ymd for *_, ymd in d_corr]:
        labels |= {DATE, FACT}
    elif Counter(_squash(response[s:e]) for s, e, _ in d_resp) != Counter(_squash(correction[s:e]) for s, e, _ in d_corr):
        labels.add(DATE)  # same dates, written otherwise
    if invalid_dates(response) and not invalid_dates(correction):
        labels |= {DATE, FACT}

    if lexicon.terms_in(response) - lexicon.terms_in(correction):
        labels.add(COMPLIANCE)
    if labels & {NUMBER}:
        labels.add(FACT)
    return [label for label in LABELS if label in labels]


def _outside(quantities: list[Quantity], spans: list[tuple[int, int, str]]) -> list[Quantity]:
    return [q for q in quantities if not any(s < q.end and q.start < e for s, e, _ in spans)]


def _unitless(tokens: Counter[str]) -> Counter[str]:
    """Quantity tokens without their unit: a JSON field carries the unit in its key ("age": 30)."""
    out: Counter[str] = Counter()
    for token, count in tokens.items():
        out[token.rsplit(":", 1)[0] if token.startswith("q:") else token] += count
    return out


def _squash(text: str) -> str:
    return re.sub(r"\s+", "", text)


def _quantity_labels(q_resp: list[Quantity], q_corr: list[Quantity]) -> set[str]:
    """number / amount_format / unit from the numbers of both texts (dates excluded)."""
    labels: set[str] = set()
    if Counter(q.value for q in q_resp) != Counter(q.value for q in q_corr):
        labels.add(NUMBER)
    # Same value, written otherwise: compare the spellings of each value both texts share.
    for value in {q.value for q in q_resp} & {q.value for q in q_corr}:
        spell_resp = Counter(_spelling(q) for q in q_resp if q.value == value)
        spell_corr = Counter(_spelling(q) for q in q_corr if q.value == value)
        if spell_resp != spell_corr:
            labels.add(AMOUNT_FORMAT)
        units_resp = Counter(q.unit for q in q_resp if q.value == value and q.unit not in _CURRENCIES)
        units_corr = Counter(q.unit for q in q_corr if q.value == value and q.unit not in _CURRENCIES)
        texts_resp = Counter(q.unit_text for q in q_resp if q.value == value and q.unit not in _CURRENCIES)
        texts_corr = Counter(q.unit_text for q in q_corr if q.value == value and q.unit not in _CURRENCIES)
        if units_resp != units_corr or texts_resp != texts_corr:
            labels.add(UNIT)
        cur_resp = Counter(q.unit for q in q_resp if q.value == value and q.unit in _CURRENCIES)
        cur_corr = Counter(q.unit for q in q_corr if q.value == value and q.unit in _CURRENCIES)
        if cur_resp and cur_corr and cur_resp != cur_corr:
            labels.add(UNIT)  # another currency
    # A value changed along with its unit (5克 -> 6千克): the units of all quantities differ.
    if Counter(q.unit for q in q_resp if q.unit) != Counter(q.unit for q in q_corr if q.unit) and NUMBER in labels:
        non_currency = {q.unit for q in q_resp + q_corr if q.unit and q.unit not in _CURRENCIES}
        if non_currency and Counter(q.unit for q in q_resp if q.unit in non_currency) != Counter(
            q.unit for q in q_corr if q.unit in non_currency
        ):
            labels.add(UNIT)
    return labels


def _spelling(q: Quantity) -> str:
    """How a number is written: digits, separators, multiplier, and for money the currency mark."""
    mark = q.unit_text if q.unit in _CURRENCIES else ""
    return f"{q.raw}|{mark}"


__all__ = ["Quantity", "content_tokens", "label_correction", "quantities_in"]
