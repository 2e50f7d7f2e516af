"""The date forms' hints (entroloop.streams.rules) skip a form only where it cannot match.

Each form is skipped when its hint is absent from the text; the reference here runs every form, as
before the hints, and both must find the same dates on hand-made edge cases (a date hidden until an
earlier match is blanked, case-folded month names, every form alone) and on every text of the
project's correction corpora and of the synthetic fleet.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from entroloop.streams import rules
from entroloop.streams.rules import date_spans

CORRECTIONS = Path(__file__).resolve().parents[2] / "data" / "corrections"


def reference_date_spans(text: str) -> tuple:
    """Every form over the progressively blanked text, no hint consulted."""
    found = []
    blanked = text
    for _, pattern in rules._DATE_PATTERNS:
        matches = list(pattern.finditer(blanked))
        for m in matches:
            groups = m.groupdict()
            month = rules._month_number(groups["mname"]) if groups.get("mname") else int(groups["m"])
            found.append((m.start(), m.end(), (int(groups["y"]) if groups.get("y") else 0, month, int(groups["d"]))))
        if matches:
            blanked = pattern.sub(lambda m: " " * len(m.group()), blanked)
    return tuple(sorted(found))


EDGE_CASES = [
    "2024-03-05", "2024/3/5 and 2024.3.5", "2024年3月5日", "3月5日", "2024 年 3 月 5 号", "March 5, 2024",
    "5 March 2024", "March 5", "Mar. 5th", "5th SEPTEMBER 2024", "ſep 5", "aprıl 5", "APRİL 5, 2024", "sEpT 9", "MAY 1", "may be 7",
    "2024-3-5mar 7",  # the month form is found only after the numeric date before it is blanked
    "2024-02-30 2024年2月30日 2月30日 Feb 30, 2023 30 Feb 2023 Feb 30",
    "12元, 3.5kg, order 2024-0001", "v1.2.3 released", "no digits at all", "", "月", "十二月", "12月",
    "price 1,234.50 on dec", "Dec\u00a05", "Oct\t7, 1999",
]


@pytest.mark.parametrize("text", EDGE_CASES)
def test_hints_find_what_every_form_finds_on_edge_cases(text: str) -> None:
    assert tuple(date_spans(text)) == reference_date_spans(text)


def _corpus_texts() -> list[str]:
    texts = []
    for path in sorted(CORRECTIONS.glob("*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            if line.strip():
                case = json.loads(line)
                texts += [case.get("prompt", ""), case.get("output", ""), case.get("corrected", "")]
    return texts


def test_hints_find_what_every_form_finds_on_the_corpora_and_the_fleet() -> None:
    from entroloop.collectors.synthetic_fleet import SyntheticFleet

    from entroloop.contract.records import Audit, Feedback

    texts = _corpus_texts()
    for request in SyntheticFleet(seed=5).requests(400):
        for record in request.records:
            if isinstance(record, Audit):
                texts.append(record.response)
            elif isinstance(record, Feedback) and record.corrected_answer:
                texts.append(record.corrected_answer)
    with_dates = [t for t in texts if reference_date_spans(t)]
    assert len(texts) > 600 and len(with_dates) > 20  # the comparison covers texts that hold dates
    assert [tuple(date_spans(t)) for t in texts] == [reference_date_spans(t) for t in texts]
