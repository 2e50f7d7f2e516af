"""A literal prefilter for a set of case-insensitive regular expressions: one Aho-Corasick pass that
says "none of them can match this text" without running any of them.

Why: the compliance paraphrase patterns are a long alternation; Python's ``re`` tries every
alternative at every position, so one search over a 36-character answer cost ~13 µs, half of the
per-response rule check, although almost no answer matches. RE2 and Hyperscan call this a
prefilter: from each pattern's parse tree take strings that every match must contain (``保证``
in ``保证(?:能)?(?:收益|回报)``, ``lose`` in ``can(?:not|'t) lose``); a text that holds none of
them cannot match, and the patterns run only on the few that do.

It must never turn away a text a pattern matches. Three things make that hold:
- only what a match must contain is taken: a literal run, a small character class spelled out, an
  alternation only when every branch has such strings, a repeat only when it repeats at least once;
  lookarounds, anchors, optional parts and anything else break a run and contribute nothing;
- case: ``re.IGNORECASE`` takes a character for a literal when their simple lower cases agree or
  ``re`` lists them as extra equivalents (ſ for s, ı for i, ς for σ ...); both the strings and the
  text are brought to one representative per such class before they are compared;
- a pattern with no such string (``\\w+``, ``(?:x|\\d)+``, anything that can match the empty string) or that
  the parser does not read turns the prefilter off (``build`` returns None): every text is then
  searched as before.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from itertools import product
from typing import Any

import ahocorasick

try:  # Python's own regular-expression parser (``sre_parse`` before 3.11)
    from re import _casefix as _re_casefix
    from re import _parser as _re_parser
except ImportError:  # pragma: no cover - other Pythons: no prefilter, every text is searched
    _re_parser = None
    _re_casefix = None

_MAX_ALTERNATIVES = 64
"""Most strings one necessary set may hold (a cross product of small classes grows fast)."""
_MAX_CLASS = 8
"""Largest character class spelled out into its characters."""


def _case_classes() -> dict[int, str]:
    """Code point -> the representative of the characters ``re.IGNORECASE`` takes for it, for the
    characters whose lower case alone does not say so (``re``'s extra cases, and İ, whose full
    lower case in ``str.lower`` is two characters where ``re`` uses the simple one, i)."""
    table: dict[int, str] = {0x130: "i"}
    if _re_casefix is None:
        return table
    groups: dict[int, set[int]] = {}
    for code, others in _re_casefix._EXTRA_CASES.items():  # type: ignore[attr-defined]
        members = {code, *others}
        for member in list(members):
            members |= groups.get(member, set())
        for member in members:
            groups[member] = members
    for code, members in groups.items():
        table[code] = chr(min(members))
    return table


_PRE_LOWER = {0x130: "i"}
_CLASSES = {code: rep for code, rep in _case_classes().items() if chr(code) != rep}
# str.translate with a dict costs ~2 µs on a short answer even when nothing changes; a class search
# for the few characters it would change costs a tenth of that, so most texts are only lowered.
_NEEDS_TRANSLATE = re.compile("[" + "".join(re.escape(chr(c)) for c in sorted({*_CLASSES, *_PRE_LOWER})) + "]").search


def fold(text: str) -> str:
    """``text`` with every character replaced by the representative of its ``re.IGNORECASE`` class:
    two characters that such a pattern takes for one another fold to the same character."""
    if _NEEDS_TRANSLATE(text) is None:
        lowered = text.lower()
        # lower() makes no such character from others, except σ -> ς at a word's end
        return lowered if _NEEDS_TRANSLATE(lowered) is None else lowered.translate(_CLASSES)
    return text.translate(_PRE_LOWER).lower().translate(_CLASSES)


Strings = frozenset[str]


def _score(strings: Strings) -> tuple[int, int]:
    """Longer strings are rarer in text, fewer of them are cheaper: the better necessary set wins."""
    return (min(len(s) for s in strings), -len(strings))


def _best(candidates: Iterable[Strings | None]) -> Strings | None:
    found = [c for c in candidates if c]
    return max(found, key=_score) if found else None


def _class_chars(items: Sequence[tuple[Any, Any]]) -> Strings | None:
    """The characters of a small, positive character class of literals (``[- ]``), else None."""
    chars: set[str] = set()
    for op, value in items:
        name = str(op)
        if name == "LITERAL":
            chars.add(fold(chr(value)))
        elif name == "RANGE" and value[1] - value[0] < _MAX_CLASS:
            chars.update(fold(chr(c)) for c in range(value[0], value[1] + 1))
        else:  # NEGATE, CATEGORY (\d, \w), a wide range: too many characters to spell out
            return None
    return frozenset(chars) if 0 < len(chars) <= _MAX_CLASS else None


def _necessary(tree: Sequence[tuple[Any, Any]]) -> Strings | None:
    """Strings at least one of which every match of the sequence ``tree`` contains, or None."""
    candidates: list[Strings | None] = []
    run: Strings | None = None  # the cross product of the consecutive single characters so far

    def close_run() -> None:
        nonlocal run
        if run is not None:
            candidates.append(run)
        run = None

    for op, value in tree:
        name = str(op)
        one: Strings | None = None  # the item as a set of single characters, when it is one
        if name == "LITERAL":
            one = frozenset({fold(chr(value))})
        elif name == "IN":
            one = _class_chars(value)
        if one is not None:
            joined = frozenset(a + b for a, b in product(run, one)) if run is not None else one
            if len(joined) > _MAX_ALTERNATIVES:
                close_run()
                joined = one
            run = joined
            continue
        close_run()
        if name == "SUBPATTERN":
            candidates.append(_necessary(value[-1]))
        elif name == "BRANCH":
            branches = [_necessary(branch) for branch in value[1]]
            if all(branches) and sum(len(b) for b in branches) <= _MAX_ALTERNATIVES:  # type: ignore[arg-type]
                candidates.append(frozenset().union(*branches))  # type: ignore[arg-type]
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT") and value[0] >= 1:
            candidates.append(_necessary(value[2]))
        elif name == "ATOMIC_GROUP":
            candidates.append(_necessary(value))
        # anything else (AT, ASSERT, ASSERT_NOT, ANY, NOT_LITERAL, GROUPREF, a repeat that may be
        # absent, a wide class) contributes nothing and only ends the run
    close_run()
    return _best(candidates)


def necessary_strings(pattern: str, flags: int = re.IGNORECASE) -> Strings | None:
    """Folded strings at least one of which every non-empty match of ``pattern`` contains; None when
    the pattern has none (or cannot be read), so no text can be turned away on its account."""
    if _re_parser is None:
        return None
    try:
        tree = _re_parser.parse(pattern, flags)
    except (re.error, RecursionError, TypeError, ValueError):
        return None
    strings = _necessary(list(tree))
    return strings if strings and all(strings) else None


class LiteralPrefilter:
    """One Aho-Corasick automaton over the necessary strings of every pattern."""

    def __init__(self, strings: Iterable[str]) -> None:
        self._automaton = ahocorasick.Automaton()
        self.strings = sorted(set(strings))
        for s in self.strings:
            self._automaton.add_word(s, s)
        self._automaton.make_automaton()

    @classmethod
    def build(cls, patterns: Iterable[str], flags: int = re.IGNORECASE) -> LiteralPrefilter | None:
        """The prefilter of ``patterns``, or None when one of them has no necessary string."""
        strings: set[str] = set()
        for pattern in patterns:
            found = necessary_strings(pattern, flags)
            if found is None:
                return None
            strings |= found
        return cls(strings) if strings else None

    def may_match(self, text: str, folded: str | None = None) -> bool:
        """False only when no pattern can match ``text`` (``folded``: ``fold(text)``, if at hand)."""
        haystack = fold(text) if folded is None else folded
        for _ in self._automaton.iter(haystack):
            return True
        return False


__all__ = ["LiteralPrefilter", "fold", "necessary_strings"]
