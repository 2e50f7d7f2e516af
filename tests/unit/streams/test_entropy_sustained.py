"""streams/entropy_bands.py ``sustained``: the rolling median the bands learn from, against numpy's
median of every window (the fast path builds its window view by hand)."""

from __future__ import annotations

import numpy as np
from entroloop.streams.entropy_bands import sustained
from hypothesis import given, settings
from hypothesis import strategies as st


@settings(max_examples=300, deadline=None, derandomize=True)
@given(values=st.lists(st.floats(min_value=0.0, max_value=16.0, width=16), max_size=120),
       window=st.integers(min_value=1, max_value=40))
def test_the_median_of_every_window_or_of_all_when_fewer_tokens(values: list[float], window: int) -> None:
    array = np.array(values, dtype=np.float16)
    got = sustained(array, window)
    as_float = array.astype(np.float32)
    if array.size == 0:
        expected = as_float
    elif array.size <= window:
        expected = np.array([np.median(as_float)])
    else:
        expected = np.array([np.median(as_float[i:i + window]) for i in range(array.size - window + 1)], dtype=np.float32)
    assert got.shape == expected.shape and np.allclose(got, expected, rtol=0, atol=1e-6)


def test_the_callers_array_is_left_as_it_was() -> None:
    values = np.array([3.0, 1.0, 2.0, 5.0, 4.0, 0.5], dtype=np.float32)
    before = values.copy()
    assert sustained(values, 3).tolist() == [2.0, 2.0, 4.0, 4.0]
    assert np.array_equal(values, before)
