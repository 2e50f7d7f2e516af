"""The redactor's shortcuts never change what it finds.

A detector's ``needs`` is searched before its pattern, and the pattern is skipped when it is absent: a
``needs`` that some match of the pattern lacks would leave that entity in clear. So every match of
every pattern, drawn from the pattern itself, must hold its detector's ``needs``. The folding shortcuts
(no full-width character: nothing to fold; ASCII: ``lower()`` is the ASCII lowering) are checked the
same way against the translation they skip.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from entroloop.infra.pii import _ASCII_LOWER, _DETECTORS, _FOLD, _FULL_WIDTH

WITH_NEEDS = [(i, d) for i, d in enumerate(_DETECTORS) if d.needs is not None]


def test_the_cheap_detectors_have_a_prefilter() -> None:
    # The shortcut is the point: e-mail, both ID forms, IBAN, passport and IP addresses are skipped
    # on an answer without their core (an @, 15 digits, ...).
    assert {"email", "cn_id", "iban", "passport", "ipv6", "ipv4"} <= {d.kind for _, d in WITH_NEEDS}


@pytest.mark.parametrize("index", [i for i, _ in WITH_NEEDS], ids=[f"{i}-{d.kind}" for i, d in WITH_NEEDS])
def test_every_match_of_a_pattern_holds_what_its_detector_needs(index: int) -> None:
    detector = _DETECTORS[index]
    assert detector.needs is not None

    @settings(max_examples=300, derandomize=True, deadline=None)
    @given(st.from_regex(detector.pattern))
    def check(text: str) -> None:
        for match in detector.pattern.finditer(text):
            assert detector.needs.search(match.group()), (detector.kind, match.group())

    check()


# Around the full-width block, its edges and the ASCII letters, plus a few that lower() treats otherwise.
_NEAR = st.sampled_from([chr(c) for c in (*range(0xFF00, 0xFF60), *range(0x41, 0x7B))] + ["İ", "K", "Σ", "中", "ﬀ"])


@settings(max_examples=500, derandomize=True, deadline=None)
@given(st.text(_NEAR, max_size=12))
def test_folding_is_skipped_only_where_it_changes_nothing(text: str) -> None:
    if _FULL_WIDTH.search(text) is None:
        assert text.translate(_FOLD) == text
    if text.isascii():
        assert text.lower() == text.translate(_ASCII_LOWER)
