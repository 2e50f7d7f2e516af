"""Near-cycles: loops that repeat with changes, which no exact period finds (streams/template_repeats.py)."""

from __future__ import annotations

import numpy as np
import pytest
from entroloop.streams.periodicity import periodic_stretches
from entroloop.streams.template_repeats import copied_tokens, template_repeat

SETTINGS = {"ngram": 4, "lookback": 160, "min_share": 0.9, "min_repeats": 3.0, "min_tokens": 16}


def _line(*words: int) -> list[int]:
    return [*words, 10]  # 10: the line break


def _find(ids: list[int]):
    return template_repeat(np.array(ids, dtype=np.uint32), **SETTINGS)


def _exact(ids: list[int]) -> dict:
    array = np.array(ids, dtype=np.uint32)
    return periodic_stretches(array, np.array([0, array.size]), 48, 3.0, 16)


# "%s: 无此目录" / "%s: 无此文件" in no fixed order, as the tiny LM wrote it (READ2)
DIR, FILE = _line(1, 2, 3, 4, 5), _line(1, 2, 3, 4, 6)
ALTERNATING = DIR + FILE + DIR + FILE + FILE + DIR + DIR + FILE + DIR + DIR + FILE + FILE + DIR


def test_two_lines_alternating_in_no_fixed_order_are_a_loop_no_exact_period_finds() -> None:
    assert _exact(ALTERNATING) == {}
    found = _find(ALTERNATING)
    assert found is not None
    assert found.end == len(ALTERNATING) and found.copied_share >= 0.9
    assert found.distance in (6, 12) and found.repeats >= 3


def test_a_line_repeated_with_one_word_changed_is_a_loop() -> None:
    template = [20, 21, 22, 23, 24, 25, 26, 27, 28]
    ids = list(range(100, 120))  # a readable opening
    for word in (40, 41, 42, 43, 44):  # the same line, one word changed each time
        ids += _line(*template, word, 29, 30, 31, 32, 33, 34, 35)
    assert _exact(ids) == {}
    found = _find(ids)
    assert found is not None and found.start >= 20 and found.end == len(ids)


def test_something_said_twice_or_a_list_of_different_items_is_not() -> None:
    sentence = list(range(200, 230))
    assert _find(list(range(100, 120)) + sentence + [7, 8] + sentence) is None  # said twice: one copy
    prefix = [50, 51, 52]  # "  -s, --": every option line starts alike, the rest differs
    options = [t for k in range(8) for t in _line(*prefix, *range(300 + 10 * k, 307 + 10 * k))]
    assert _find(options) is None
    three = list(range(100, 120)) + sentence * 3
    assert _find(three) is not None  # the third time it is a loop


def test_copies_from_further_back_than_the_lookback_do_not_count() -> None:
    block = list(range(500, 540))
    spaced = np.array([t for k in range(4) for t in block + [1000 + k, 2000 + k]], dtype=np.uint32)
    assert template_repeat(spaced, **SETTINGS) is not None  # the same 40 tokens every 42 tokens
    assert template_repeat(spaced, **{**SETTINGS, "lookback": 41}) is None  # further back than the lookback


def test_a_cycle_of_a_few_tokens_is_left_to_the_exact_check() -> None:
    copied, distance = copied_tokens(np.array([5, 6] * 30, dtype=np.uint32), 4, 160)
    assert not copied.any() and not distance.any()  # every copy overlaps itself: a short exact cycle
    assert _exact([5, 6] * 30) != {}


def test_a_copy_is_told_by_its_ids() -> None:
    ids = np.array(list(range(40)) + list(range(40)), dtype=np.uint32)
    copied, distance = copied_tokens(ids, 4, 160)
    assert copied[40:].all() and not copied[:40].any() and set(distance[distance > 0].tolist()) == {40}
    # the same ids in another order (same sum, same set) are no copy
    reversed_blocks = np.array([t for k in range(10) for t in ([1, 2, 3, 4] if k % 2 else [4, 3, 2, 1])],
                               dtype=np.uint32)
    copied, distance = copied_tokens(reversed_blocks, 4, 160)
    assert set(distance[distance > 0].tolist()) <= {8}  # only true copies, two blocks back
    assert copied_tokens(np.array([1, 2, 3, 4, 9, 9, 9, 9, 4, 3, 2, 1], dtype=np.uint32), 4, 160)[1].sum() == 0


@pytest.mark.parametrize("size", [0, 1, 3, 4, 5])
def test_short_records(size: int) -> None:
    assert _find(list(range(size))) is None


def test_any_ngram_length_setting_works() -> None:
    """ENTROLOOP_LOOP_TEMPLATE_NGRAM has no upper bound: a long n-gram is compared exactly too."""
    line = list(range(20, 34))
    found = template_repeat(np.array(list(range(100, 120)) + line * 4, dtype=np.uint32), **{**SETTINGS, "ngram": 12})
    assert found is not None and found.distance == 14 and found.end == 76
