"""Bad cases on the page: every stored text escaped, the minimal failing example marked, the diff
shown as deletions and insertions, long texts shortened around the example."""

from __future__ import annotations

from entroloop.report.cases import CONTEXT_CHARS, bad_case_html
from entroloop.report.data import BadCaseRow

SCRIPT = "<script>alert(1)</script>"


def case(**overrides) -> BadCaseRow:
    values = dict(
        emitted_at=1_790_000_000.0, request_id="req-1", model="m", route="billing", adapter="", labels=["number"],
        confidence=0.9, prompt="How much?", response="The refund is 12.5 USD.", correction="The refund is 12.8 USD.",
        diff=[("replace", "12.5", "12.8")], minimal_span=(14, 22),
    )
    values.update(overrides)
    return BadCaseRow(**values)


def test_minimal_example_is_the_span_and_its_replacement():
    assert case().minimal_example == ("12.5 USD", "12.8 USD")
    inserted = case(response="Pay 5.", correction="Pay 5 USD now.", minimal_span=(4, 5))
    assert inserted.minimal_example == ("5", "5 USD now")
    assert case(minimal_span=(0, 999)).minimal_example[0] == "The refund is 12.5 USD."  # clamped to the text


def test_output_correction_diff_and_labels_are_shown():
    html = bad_case_html(case())
    assert "The refund is <mark>12.5 USD</mark>." in html  # the output
    assert "The refund is <mark>12.8 USD</mark>." in html  # the correction
    assert "<del>12.5 USD</del> → <ins>12.8 USD</ins>" in html  # the minimal failing example
    assert "<li><span class='op'>replace</span> <del>12.5</del> → <ins>12.8</ins></li>" in html
    assert "<span class='chip'>number</span>" in html and "<code>req-1</code>" in html
    assert "characters 14–22" in html


def test_every_stored_text_is_escaped():
    html = bad_case_html(case(
        request_id=SCRIPT, model=SCRIPT, route=SCRIPT, adapter=SCRIPT, labels=[SCRIPT], prompt=SCRIPT,
        response=f"The refund is {SCRIPT}.", correction=f"The refund is {SCRIPT} 12.8 USD.",
        diff=[("insert", "", SCRIPT), (SCRIPT, SCRIPT, "")], minimal_span=(14, 39),
    ))
    assert "<script" not in html
    assert html.count("&lt;script&gt;alert(1)&lt;/script&gt;") >= 10


def test_long_texts_are_shortened_around_the_example():
    response = "a" * 5_000 + " 12.5 USD " + "b" * 5_000
    correction = "a" * 5_000 + " 12.8 USD " + "b" * 5_000
    html = bad_case_html(case(response=response, correction=correction, minimal_span=(5_001, 5_009),
                              diff=[("replace", "12.5", "12.8")]))
    assert "<mark>12.5 USD</mark>" in html and "<mark>12.8 USD</mark>" in html
    assert "a" * (CONTEXT_CHARS + 1) not in html and "…" in html
    assert len(html) < 6_000
