"""The text-only labeller behind tests/data/entropy/lm_traces_{dev,test}.jsonl (pure logic, no model)."""

from __future__ import annotations

from tests.corpora.text_labels import Lexicon, label, loop_evidence, script_switches

LEXICON = Lexicon.from_texts(
    ["cannot open the file for reading", "use git commit to record changes"],
    ["无法打开文件进行读取", "使用 git commit 记录变更"],
)


def test_a_phrase_repeated_verbatim_is_a_loop_with_its_period() -> None:
    text = "cannot open the file " + "use git commit, " * 4
    evidence = loop_evidence(text)
    assert evidence is not None and evidence.period == len("use git commit, ")
    assert label(text, LEXICON)["loop"]


def test_chinese_loop_and_whitespace_does_not_hide_it() -> None:
    assert label(
        "无法打开文件\n无法打开文件\n  无法打开文件 无法打开文件 无法打开文件 无法打开文件 无法打开文件",
        LEXICON,
    )["loop"]


def test_a_phrase_said_twice_or_a_short_run_is_not_a_loop() -> None:
    assert not label("cannot open the file, cannot open the file for reading", LEXICON)[
        "loop"
    ]
    assert not label("ab ab ab ab", LEXICON)["loop"]  # periodic but under 40 characters


def test_a_run_of_blank_lines_is_a_loop_of_period_one() -> None:
    text = "usage: git commit <file>" + "\n" * 42
    evidence = loop_evidence(text)
    assert evidence is not None and (evidence.period, evidence.length) == (1, 42)
    assert label(text, LEXICON)["loop"]
    # paragraphs apart, or a few blank lines, are not: under LOOP_MIN_CHARS line breaks
    assert not label("use git commit\n\n\n\ncannot open the file" + "\n \n" * 19, LEXICON)["loop"]


def test_known_words_in_either_language_are_not_gibberish() -> None:
    verdict = label(
        "cannot open the file for reading 无法打开文件进行读取 use git commit", LEXICON
    )
    assert not verdict["gibberish"] and not verdict["loop"]


def test_unknown_words_and_replacement_characters_are_gibberish() -> None:
    assert label("qzx vrrk plo \ufffd\ufffd mnb wq 件打读 trz", LEXICON)["gibberish"]


def test_known_pieces_glued_across_scripts_are_gibberish() -> None:
    text = "file打开the文件 commit读取use git变更 reading无法"
    assert script_switches(text) >= 3
    assert label(text, LEXICON)["gibberish"]


def test_too_little_text_is_never_gibberish() -> None:
    assert not label("qzx \ufffd", LEXICON)["gibberish"]
