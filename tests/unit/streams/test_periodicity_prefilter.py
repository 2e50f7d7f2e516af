"""The periodicity prefilter only saves work: a batch's stretches are the same with it as when every
record is compared at every lag, wherever in a record the loop sits."""

import numpy as np
import pytest
from entroloop.streams.periodicity import _compare_lags, periodic_stretches


def _batch(records: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    bounds = np.zeros(len(records) + 1, dtype=np.int64)
    np.cumsum([r.size for r in records], out=bounds[1:])
    return np.concatenate(records), bounds


def _every_lag(flat: np.ndarray, bounds: np.ndarray, *args, tolerance=None, min_spread=0.0):
    """The same search without the prefilter: every record, every lag."""
    owner = np.repeat(np.arange(bounds.size - 1), np.diff(bounds))
    values = flat.astype(np.float32) if tolerance is not None else flat
    return _compare_lags(values, bounds, owner, *args, tolerance, min_spread)


def _random_ids(rng: np.random.Generator, size: int, vocabulary: int) -> np.ndarray:
    return rng.integers(0, vocabulary, size).astype(np.uint32)


def test_a_loop_at_the_start_of_a_record_after_a_repetitive_tail_is_found() -> None:
    """The record before ends in a short cycle (too short to be a loop) of tokens that the next
    record's opening loop uses too: the prefilter, comparing the whole batch at each lag, sees the
    tail's tokens recur across the edge, so the two runs touch. Each record's own run must decide,
    or the loop in the second record is never compared."""
    rng = np.random.default_rng(3)
    tail = np.tile(np.array([7, 8, 9], dtype=np.uint32), 4)  # 12 recurring tokens: short of a loop
    first = np.concatenate([_random_ids(rng, 60, 50_000), tail])
    loop = np.tile(np.array([7, 8, 9, 104, 105], dtype=np.uint32), 8)
    second = np.concatenate([loop, _random_ids(rng, 40, 50_000)])
    flat, bounds = _batch([first, second])
    args = (12, 3.0, 24)
    found = periodic_stretches(flat, bounds, *args)
    assert found == _every_lag(flat, bounds, *args)
    assert 0 not in found
    assert (found[1].period, found[1].start, found[1].end) == (5, 0, 40)


@pytest.mark.parametrize("seed", range(12))
def test_token_id_batches_find_what_every_lag_finds(seed: int) -> None:
    rng = np.random.default_rng(seed)
    records = []
    for _ in range(int(rng.integers(20, 60))):
        ids = _random_ids(rng, int(rng.integers(0, 300)), int(rng.choice([20, 200, 50_000])))
        if ids.size > 30 and rng.random() < 0.4:  # a loop somewhere, often at an edge
            period = int(rng.integers(1, 49))
            length = int(rng.integers(period, 4 * period + 30))
            at = int(rng.choice([0, ids.size, int(rng.integers(0, ids.size))]))
            cycle = _random_ids(rng, period, 50_000)
            ids = np.concatenate([ids[:at], np.resize(cycle, length), ids[at:]])
        records.append(ids)
    flat, bounds = _batch(records)
    args = (48, 3.0, 24)
    assert periodic_stretches(flat, bounds, *args) == _every_lag(flat, bounds, *args)


@pytest.mark.parametrize("seed", range(8))
def test_entropy_batches_find_what_every_lag_finds(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    records = []
    for _ in range(int(rng.integers(20, 50))):
        values = rng.gamma(2.0, 1.2, int(rng.integers(0, 250)))
        if values.size > 30 and rng.random() < 0.5:
            period = int(rng.integers(2, 30))
            cycle = rng.gamma(2.0, 1.2, period)
            repeated = np.resize(cycle, int(rng.integers(2 * period, 5 * period + 10)))
            repeated = repeated + rng.normal(0, 0.08, repeated.size)  # within the tolerance, mostly
            at = int(rng.choice([0, values.size, int(rng.integers(0, values.size))]))
            values = np.concatenate([values[:at], repeated, values[at:]])
        records.append(values.astype(np.float16))
    flat, bounds = _batch(records)
    args = (48, 3.0, 24)
    with_prefilter = periodic_stretches(flat, bounds, *args, tolerance=(0.25, 0.0), min_spread=0.5)
    assert with_prefilter == _every_lag(flat, bounds, *args, tolerance=(0.25, 0.0), min_spread=0.5)
    assert with_prefilter  # the batch has loops to find, or the comparison proves little
