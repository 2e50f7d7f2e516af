"""The prefilter's grouping sort gives exactly numpy's stable argsort, in its fast packed form and in
the fallback for keys too wide to pack with their positions."""

import numpy as np
import pytest
from entroloop.streams.periodicity import _grouped_in_position_order


@pytest.mark.parametrize("high", [1, 2, 50, 1 << 20, 1 << 41, 1 << 61])
def test_same_order_as_a_stable_argsort(high):
    rng = np.random.default_rng(high % 1000)
    for n in (0, 1, 2, 17, 4096):
        key = rng.integers(0, high, n, dtype=np.int64)
        expected = np.argsort(key, kind="stable")
        ordered, order = _grouped_in_position_order(key)
        assert np.array_equal(order, expected)
        assert np.array_equal(ordered, key[expected])


def test_negative_keys_take_the_stable_argsort():
    key = np.array([3, -1, 3, -1, 0], dtype=np.int64)
    ordered, order = _grouped_in_position_order(key)
    assert order.tolist() == [1, 3, 4, 0, 2]
    assert ordered.tolist() == [-1, -1, 0, 3, 3]
