"""The compliance patterns' literal prefilter never turns away a text that a pattern matches, and the
lexicon finds exactly what it found without it."""

import json
import random
import re
from pathlib import Path

import pytest
from entroloop.streams.literal_prefilter import (
    LiteralPrefilter,
    fold,
    necessary_strings,
)
from entroloop.streams.rules import DEFAULT_COMPLIANCE_PATTERNS, ComplianceLexicon

DATA = Path(__file__).resolve().parents[2] / "data"

# Patterns with the constructs the extraction walks: classes, ranges, nested alternations, repeats,
# lookarounds, anchors, inline flags, a case-sensitive group, a back-reference.
TRICKY = (
    r"risk[- ]free(?! rate)|\bzero\s+risk",
    r"(?:ab|a[b-d])+x{2,3}",
    r"(?<!不)保证(?:能)?(?:收益|回报)",
    r"(?-i:Sure)\s*(?:thing|bet)",
    r"(?x) guaran tee d",
    r"(q)\1z",
    r"(?:will|shall)\s(?:rise|fall)s?",
    r"ſtraße|ΣΟΦΙΑ",
    r"[sS]ı[kK]",
)

PIECES = (
    "risk", "-", " ", "free", "rate", "zero", "ab", "ac", "ad", "x", "xx", "不", "保证", "能", "收益",
    "回报", "sure", "Sure", "SURE", "thing", "bet", "guaranteed", "q", "z", "will", "shall", "rise",
    "fall", "s", "ſ", "İ", "ı", "K", "k", "straße", "STRASSE", "σοφια", "ΣΟΦΙΑ", "ς", "稳赚", "100%",
    "百分百", "赔付", "can't", "lose", "never", "insider", "tips", "double your money", "7", "。",
)


def test_the_strings_each_pattern_needs():
    assert necessary_strings(r"保证(?:能)?(?:收益|回报)") == {"保证"}
    assert necessary_strings(r"risk[- ]free(?! rate)|zero risk") == {"risk-free", "risk free", "zero risk"}
    assert necessary_strings(r"(?:will|is going to) (?:definitely|surely)") == {"definitely", "surely"}
    assert necessary_strings(r"GUARANTEED") == {"guaranteed"}  # folded as IGNORECASE compares
    assert necessary_strings(r"ſure") == {"sure"}


@pytest.mark.parametrize("pattern", [r"a?", r"ab|c?", r"\w+", r"(?:x|\d)+", r".*", r"(", r""])
def test_patterns_without_a_necessary_string_turn_the_prefilter_off(pattern):
    assert necessary_strings(pattern) is None
    assert LiteralPrefilter.build([r"保证", pattern]) is None


def test_folding_follows_what_ignorecase_takes_for_one_letter():
    for a, b in (("s", "ſ"), ("i", "ı"), ("i", "İ"), ("k", "K"), ("σ", "ς"), ("µ", "μ"), ("A", "a")):
        assert re.fullmatch(re.escape(a), b, re.IGNORECASE), (a, b)
        assert fold(a) == fold(b), (a, b)


@pytest.mark.parametrize("patterns", [DEFAULT_COMPLIANCE_PATTERNS, TRICKY], ids=["defaults", "tricky"])
def test_no_text_a_pattern_matches_is_turned_away(patterns):
    prefilter = LiteralPrefilter.build(patterns)
    assert prefilter is not None
    compiled = [re.compile(p, re.IGNORECASE) for p in patterns]
    rng = random.Random(20261205)
    matched = 0
    for _ in range(20_000):
        text = "".join(rng.choice(PIECES) for _ in range(rng.randint(1, 8)))
        if rng.random() < 0.3:
            text = text.upper()
        for lowered in (text, text.lower()):  # the lexicon runs its patterns on text.lower()
            if any(p.search(lowered) for p in compiled):
                matched += 1
                assert prefilter.may_match(lowered), (text, lowered)
    assert matched > 500  # the generator does reach the patterns


def test_the_lexicon_finds_the_same_with_and_without_the_prefilter():
    texts = []
    for name in ("dev.jsonl", "heldout.jsonl"):
        for line in (DATA / "corrections" / name).read_text(encoding="utf-8").splitlines():
            case = json.loads(line)
            texts += [case["output"], case["corrected"], case["prompt"]]
    with_prefilter = ComplianceLexicon()
    without = ComplianceLexicon()
    without._prefilter = None
    assert with_prefilter._prefilter is not None
    found = [with_prefilter.find(t) for t in texts]
    assert found == [without.find(t) for t in texts]
    assert sum(bool(f) for f in found) >= 10  # the corpus has compliance cases to find
