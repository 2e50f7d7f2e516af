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
import functools
import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import ahocorasick
import msgspec
from entroloop.streams.literal_prefilter import LiteralPrefilter

from entroloop.contract.settings import Settings

# The bad-case label vocabulary (docs/processors.md, "Bad-case labels"). Rule names are also
# bad-case labels and retrain categories: keep them stable.
NUMBER = "number"  # a numeric value changed (500 -> 600); never for a format-only change
FACT = "fact"  # the content changed (a value, entity, claim or date), not just its form
AMOUNT_FORMAT = "amount_format"  # a number's written form changed, same value (12元 -> 12.00元, 1,000 -> 1000)
UNIT = "unit"  # a quantity's unit changed, was added or dropped, or is written otherwise (公斤 -> kg)
DATE = "date"  # a date changed, was invalid, or is written otherwise
JSON_SCHEMA = "json_schema"  # the correction is JSON and the output is not / has other keys or types
COMPLIANCE = "compliance"  # the correction removed a compliance term or paraphrase (稳赚, guaranteed returns)
OTHER = "other"  # none of the above (the joiner's fallback label)
LABELS = (NUMBER, FACT, AMOUNT_FORMAT, UNIT, DATE, JSON_SCHEMA, COMPLIANCE)
RULES = LABELS

# A small built-in compliance lexicon (financial-service answers); deployments add their own
# through ENTROLOOP_COMPLIANCE_LEXICON. Matching is case-insensitive.
DEFAULT_COMPLIANCE_LEXICON: tuple[str, ...] = (
    "保证收益",
    "稳赚不赔",
    "零风险",
    "保本保息",
    "内幕消息",
    "guaranteed return",
    # "risk-free" is a pattern below, so that "risk-free rate" (a finance term) does not match.
    "no risk",
    "insider information",
)

# Paraphrases a fixed lexicon misses (regular expressions, case-insensitive); deployments add their
# own through ENTROLOOP_COMPLIANCE_PATTERNS. A match right after a negation (不保证收益, "not
# risk-free") is the compliant wording, not a violation.
DEFAULT_COMPLIANCE_PATTERNS: tuple[str, ...] = (
    r"稳赚|稳赢|包赚|必赚|躺赚|只赚不赔|稳涨|必涨",
    r"保证(?:能)?(?:收益|回报|盈利|赚钱|理赔|赔付|获赔|本金|保本|通过|放款|中签|上涨|翻倍|获批)",
    # 无风险利率 / "risk-free rate" are finance terms, not promises.
    r"保本(?:保息)?|零风险|无风险(?!利率|收益率|资产)|没有(?:任何)?风险|毫无风险",
    r"(?:百分之?百|100%)(?:能)?(?:赔付|理赔|获赔|收益|回本|保本|通过|获批|赚|安全)",
    r"(?:一定|肯定|绝对)(?:能|会|可以)?(?:赚|盈利|理赔|赔付|获赔|涨|回本|通过|获批|安全|不亏)",
    r"内幕(?:消息|信息)",
    r"guarantee[ds]?\s+(?:\w+\s+){0,2}?(?:returns?|profits?|income|payouts?|approval|claims?|gains?|yields?)",
    r"guaranteed\s+to\s+(?:double|profit|pay|win|rise|go up|be approved)",
    r"risk[- ]free(?! (?:rate|asset|interest))|zero risk|without (?:any )?risk",
    r"can(?:not|'t|’t) lose|never lose (?:money)?",
    r"(?:will|is going to) (?:definitely|surely|certainly) (?:rise|go up|pay(?: out)?|profit|double|be approved)",
    r"sure[- ](?:fire|thing|win|bet)|double your money",
    r"insider (?:information|info|tips?)",
    r"100% (?:safe|guaranteed|approval|payout|returns?|approved)",
)
_NEGATION_ZH = re.compile(
    r"(?:不|非|无|没有|未|并非|并不|不会|不能|无法|不可能|不承诺|切勿|禁止|勿)(?:一定|会|能|可以|可|承诺|作|做|是)?\s*$"
)
_NEGATION_EN = re.compile(r"\b(?:not|no|never|cannot|can't|isn't|aren't|without|nor)\s+(?:\w+\s+){0,1}$", re.IGNORECASE)


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
    return list(_recent_tokens(text) if len(text) <= _CACHED_TOKENS_MAX_CHARS else _scan_tokens(text))


def _scan_tokens(text: str) -> tuple[Token, ...]:
    return tuple([Token(m.group(), *m.span()) for m in _TOKEN_RE.finditer(text)])


# One bad case tokenizes its response and its correction more than once (diff, failing example,
# content tokens): at most four texts, back to back. Only short ones are kept (a token costs ~100
# bytes, so a 1 MiB answer's would be tens of MB); frozen tokens are safe to share.
_CACHED_TOKENS_MAX_CHARS = 4096
_recent_tokens = functools.lru_cache(maxsize=8)(_scan_tokens)


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


def _yuan_matches(text: str) -> Iterator[re.Match[str]]:
    # Every amount has one of the three marks; four in five answers have none, and the scan costs
    # ~2 µs on a short one (it retries at each digit of every number).
    if "元" in text or "¥" in text or "￥" in text:
        return _YUAN_RE.finditer(text)
    return iter(())


_MONTHS = {
    name: i
    for i, names in enumerate(
        [("jan", "january"), ("feb", "february"), ("mar", "march"), ("apr", "april"), ("may",),
         ("jun", "june"), ("jul", "july"), ("aug", "august"), ("sep", "sept", "september"),
         ("oct", "october"), ("nov", "november"), ("dec", "december")],
        start=1,
    )
    for name in names
}
_MONTH_NAME = r"(?P<mname>" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
# What each date form cannot match without, checked once on the text before any blanking (blanking
# turns characters into spaces, so it never creates one): a form whose hint is absent is skipped.
# Most answers hold digits and no date, and a hint costs a fraction of a form's pattern.
_NUMERIC_DATE_HINT = re.compile(r"\d[-/.]\d").search
_MONTH_PREFIXES = tuple(sorted({name[:3] for name in _MONTHS}))


_MONTH_PREFIX_FILTER = LiteralPrefilter(_MONTH_PREFIXES)


def _has_month_prefix(text: str) -> bool:
    # casefold(), not lower(): every character the patterns' IGNORECASE takes for a letter of these
    # prefixes (ſ for s) folds to that letter. One automaton pass: half the time of twelve
    # substring tests, a third of one case-insensitive search.
    return _MONTH_PREFIX_FILTER.may_match(text, folded=text.casefold())


# The patterns match month names case-insensitively, which in Unicode also admits ſ for s, and ı
# and İ for i: a plain lower() of such a match is no key of _MONTHS (a KeyError on one answer).
_DOTTED_I = str.maketrans({"ı": "i", "İ": "i"})


def _month_number(name: str) -> int:
    return _MONTHS[name.translate(_DOTTED_I).casefold()]


def _has_yue(text: str) -> bool:
    return "月" in text


# Most specific first: each match is blanked before the next pattern runs, so 2024年3月5日 is one
# date, not also a year-less 3月5日. Year 0 means "no year written". Each form with its hint.
_DATE_PATTERNS = (
    (_NUMERIC_DATE_HINT, re.compile(r"(?<!\d)(?P<y>\d{4})[-/.](?P<m>\d{1,2})[-/.](?P<d>\d{1,2})(?!\d)")),
    (_has_yue, re.compile(r"(?P<y>\d{4})\s*年\s*(?P<m>\d{1,2})\s*月\s*(?P<d>\d{1,2})\s*[日号]")),
    (_has_month_prefix, re.compile(rf"\b{_MONTH_NAME}\s+(?P<d>\d{{1,2}})(?:st|nd|rd|th)?,?\s+(?P<y>\d{{4}})\b", re.IGNORECASE)),
    (_has_month_prefix, re.compile(rf"\b(?P<d>\d{{1,2}})(?:st|nd|rd|th)?\s+{_MONTH_NAME}\s+(?P<y>\d{{4}})\b", re.IGNORECASE)),
    (_has_yue, re.compile(r"(?<![\d年])(?P<m>\d{1,2})\s*月\s*(?P<d>\d{1,2})\s*[日号]")),
    (_has_month_prefix, re.compile(rf"\b{_MONTH_NAME}\s+(?P<d>\d{{1,2}})(?:st|nd|rd|th)?\b(?!\s*[,:]?\s*\d{{4}})", re.IGNORECASE)),
)


_HAS_DIGIT = re.compile(r"\d").search


def date_spans(text: str) -> list[tuple[int, int, tuple[int, int, int]]]:
    """(start, end, (year, month, day)) of every date, in text order; year 0 when not written.

    Forms: 2024-03-05, 2024/3/5, 2024.3.5, 2024年3月5日, 3月5日, March 5, 2024, 5 March 2024,
    March 5."""
    return list(_date_spans(text))


@functools.lru_cache(maxsize=64)
def _date_spans(text: str) -> tuple[tuple[int, int, tuple[int, int, int]], ...]:
    # Cached: the bad-case join asks for the dates of the same response and correction several
    # times in a row (numbers, quantities, labels, the minimal failing example). Small, because
    # the repeats are back to back and a text may be up to a record's size (1 MiB): 64 such texts
    # at most stay in memory, where 1,024 could have held a gigabyte. Every date has a digit,
    # so most answers need no pattern at all; a text is blanked only where a pattern matched.
    if not _HAS_DIGIT(text):
        return ()
    found = []
    blanked = text
    hinted: dict[Callable[[str], object], bool] = {}  # hint -> whether the text has it (forms share hints)
    for hint, pattern in _DATE_PATTERNS:
        if hint not in hinted:
            hinted[hint] = bool(hint(text))
        if not hinted[hint]:
            continue
        matches = list(pattern.finditer(blanked))
        for m in matches:
            groups = m.groupdict()
            month = _month_number(groups["mname"]) if groups.get("mname") else int(groups["m"])
            year = int(groups["y"]) if groups.get("y") else 0
            found.append((m.start(), m.end(), (year, month, int(groups["d"]))))
        if matches:
            blanked = pattern.sub(lambda m: " " * len(m.group()), blanked)
    return tuple(sorted(found))


def _norm_number(raw: str) -> str:
    """Canonical text of a number so 1,200.0 and 1200 compare equal."""
    cleaned = raw.replace(",", "").replace("，", "")
    try:
        value = float(cleaned)
    except ValueError:
        return cleaned
    return repr(value) if not value.is_integer() else str(int(value))


def without_dates(text: str) -> str:
    """``text`` with every date blanked out by as many spaces (offsets keep their meaning), so a
    changed day counts as a date error, not a number one."""
    spans = _date_spans(text)
    if not spans:
        return text
    pieces = []
    cursor = 0
    for start, end, _ in spans:  # sorted by start
        start = max(start, cursor)  # an overlap (none is known) must not lengthen the text
        if start >= end:
            continue
        pieces.append(text[cursor:start])
        pieces.append(" " * (end - start))
        cursor = end
    pieces.append(text[cursor:])
    return "".join(pieces)


def numbers(text: str) -> list[str]:
    """Every number in ``text`` outside dates, normalised, in order."""
    return [_norm_number(m.group(1)) for m in _NUMBER_RE.finditer(without_dates(text))]


def quantities(text: str) -> list[tuple[str, str]]:
    """(number, unit) for every number followed by a known unit; unit lower-cased."""
    out = []
    text = without_dates(text)
    for m in _NUMBER_RE.finditer(text):
        unit = _UNIT_AFTER_RE.match(text, m.end())
        if unit:
            out.append((_norm_number(m.group(1)), unit.group(1).lower()))
    return out


def yuan_amounts(text: str) -> list[str]:
    """Raw amount strings written with 元, ¥ or ￥."""
    return [m.group(1) or m.group(2) for m in _yuan_matches(text)]


def bad_yuan_amounts(text: str) -> list[str]:
    """Amounts in yuan not written with exactly two decimals (e.g. ``12元``, ``3.5元``)."""
    return [a for a in yuan_amounts(text) if not _YUAN_OK.match(a.replace("，", ","))]


def dates(text: str) -> list[tuple[int, int, int]]:
    """(year, month, day) of every date (forms in ``date_spans``), in text order."""
    return [ymd for _, _, ymd in date_spans(text)]


def invalid_dates(text: str) -> list[tuple[int, int, int]]:
    """Dates that do not exist on the calendar (2024-02-30, 2023-13-01)."""
    bad = []
    for y, m, d in dates(text):
        try:
            dt.date(y or 2000, m, d)  # no year written: a leap year, so 2月29日 stays valid
        except ValueError:
            bad.append((y, m, d))
    return bad


class ComplianceLexicon:
    """Compliance terms (Aho-Corasick: one pass per text whatever their number) and paraphrase
    patterns (regular expressions), both case-insensitive; a match right after a negation
    (不保证收益, "not risk-free") is the compliant wording and is skipped."""

    def __init__(
        self,
        terms: Iterable[str] = DEFAULT_COMPLIANCE_LEXICON,
        patterns: Iterable[str] = DEFAULT_COMPLIANCE_PATTERNS,
    ) -> None:
        self._automaton = ahocorasick.Automaton()
        self.terms = sorted({t.lower() for t in terms if t.strip()})
        for term in self.terms:
            self._automaton.add_word(term, term)
        if self.terms:
            self._automaton.make_automaton()
        sources = [p for p in patterns if p.strip()]
        self.patterns = [re.compile(p, re.IGNORECASE) for p in sources]
        self._any_pattern = _any_of(sources)
        # Strings every match must contain: most texts hold none, and one automaton pass says so
        # (~1 µs) where the joined search costs ~13 µs on a short answer (streams/literal_prefilter.py).
        self._prefilter = LiteralPrefilter.build(sources)

    def find(self, text: str) -> list[tuple[int, int, str]]:
        """(start, end, term) of every non-negated match, in order; where a term and a pattern
        overlap the longer match wins, so one phrase counts once."""
        lowered = text.lower()
        # lower() keeps length for the scripts the lexicon uses, so offsets stay valid; where it
        # does not (rare ligatures) the terms are still found, only offsets may shift.
        hits = [(end - len(t) + 1, end + 1, t) for end, t in self._automaton.iter(lowered)] if self.terms else []
        # Most texts match no pattern: one scan says so, instead of one scan per pattern.
        # The patterns run on ``lowered``, so the prefilter reads that too (it never turns away a text
        # a pattern matches, and then the one joined search says whether any does).
        may_match = (self._prefilter is None or self._prefilter.may_match(lowered)) and (
            self._any_pattern is None or self._any_pattern(lowered))
        for pattern in self.patterns if may_match else ():
            hits.extend((m.start(), m.end(), m.group().lower()) for m in pattern.finditer(lowered) if m.end() > m.start())
        kept: list[tuple[int, int, str]] = []
        for start, end, term in sorted(hits, key=lambda h: (h[0], h[0] - h[1])):
            if kept and start < kept[-1][1]:
                continue  # overlaps a longer (or earlier) match of the same phrase
            if _negated(lowered, start):
                continue
            kept.append((start, end, term))
        return kept

    def terms_in(self, text: str) -> Counter[str]:
        return Counter(t for _, _, t in self.find(text))


_BACKREFERENCE = re.compile(r"\\[1-9]|\(\?P=")


def _any_of(sources: list[str]) -> Callable[[str], Any] | None:
    """A ``search`` that finds something exactly when one of ``sources`` matches somewhere; None
    when the patterns cannot be joined safely (a back-reference would point at another pattern's
    group, a global flag in the middle does not compile): then every pattern is scanned."""
    if not sources or any(_BACKREFERENCE.search(p) for p in sources):
        return None
    try:
        return re.compile("|".join(f"(?:{p})" for p in sources), re.IGNORECASE).search
    except re.error:
        return None


def _negated(lowered: str, start: int) -> bool:
    """Whether the match at ``start`` follows a negation (不 / 并非 / not / never ...)."""
    before = lowered[max(0, start - 24) : start]
    return bool(_NEGATION_ZH.search(before[-8:]) or _NEGATION_EN.search(before))


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
    """The rule set, configured once: compliance lexicon and patterns, JSON schemas per route."""

    def __init__(
        self,
        lexicon: Iterable[str] = DEFAULT_COMPLIANCE_LEXICON,
        json_schemas: Mapping[str, Mapping[str, Any]] | None = None,
        patterns: Iterable[str] = DEFAULT_COMPLIANCE_PATTERNS,
    ) -> None:
        self.lexicon = ComplianceLexicon(lexicon, patterns)
        self.json_schemas = dict(json_schemas or {})

    @classmethod
    def from_settings(cls, settings: Settings) -> ResponseRules:
        """The built-in lexicon and patterns plus the deployment's (ENTROLOOP_COMPLIANCE_LEXICON,
        ENTROLOOP_COMPLIANCE_PATTERNS): the bad-case joiner and the per-response checker both build
        their rules here, so a term added once counts in both."""
        return cls(
            lexicon=(*DEFAULT_COMPLIANCE_LEXICON, *settings.compliance_lexicon),
            patterns=(*DEFAULT_COMPLIANCE_PATTERNS, *settings.compliance_patterns),
        )

    def check_response(self, text: str, route: str = "default") -> list[Violation]:
        """Every rule ``text`` breaks on its own (no correction needed)."""
        out: list[Violation] = []
        for m in _yuan_matches(text):
            amount = m.group(1) or m.group(2)
            if not _YUAN_OK.match(amount.replace("，", ",")):
                out.append(Violation(AMOUNT_FORMAT, f"amount {m.group()!r} needs two decimals", m.start(), m.end()))
        for y, mo, d in invalid_dates(text):
            out.append(Violation(DATE, f"no such date {y:04d}-{mo:02d}-{d:02d}"))
        schema = self.json_schemas.get(route)
        if schema is not None:
            out.extend(Violation(JSON_SCHEMA, reason) for reason in json_schema_violations(text, schema))
        for start, end, term in self.lexicon.find(text):
            out.append(Violation(COMPLIANCE, f"compliance term {term!r}", start, end))
        return out

    def compare(self, response: str, correction: str, route: str = "default") -> list[str]:
        """Labels explaining what the correction changed, in ``LABELS`` order; [] if none applies.

        The vocabulary and its rules live in ``entroloop.streams.correction_labels``."""
        # Imported here: correction_labels builds on this module.
        from entroloop.streams.correction_labels import label_correction

        return label_correction(response, correction, self.lexicon, self.json_schemas.get(route))


__all__ = [
    "AMOUNT_FORMAT",
    "COMPLIANCE",
    "DATE",
    "DEFAULT_COMPLIANCE_LEXICON",
    "DEFAULT_COMPLIANCE_PATTERNS",
    "FACT",
    "JSON_SCHEMA",
    "LABELS",
    "NUMBER",
    "OTHER",
    "RULES",
    "UNIT",
    "ComplianceLexicon",
    "ResponseRules",
    "Token",
    "Violation",
    "bad_yuan_amounts",
    "date_spans",
    "dates",
    "invalid_dates",
    "json_schema_violations",
    "numbers",
    "quantities",
    "tokenize",
    "without_dates",
    "yuan_amounts",
]
