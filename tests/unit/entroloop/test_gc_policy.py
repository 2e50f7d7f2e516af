"""The stream workers' collector settings (entroloop.infra.gc_policy)."""

import gc

from entroloop.infra.gc_policy import MIDDLE_THRESHOLD, OLD_THRESHOLD, YOUNG_THRESHOLD, tune_for_streaming


def test_tuning_freezes_the_start_up_heap_and_batches_collections() -> None:
    before = gc.get_threshold()
    try:
        assert tune_for_streaming() == before
        assert gc.get_threshold() == (YOUNG_THRESHOLD, MIDDLE_THRESHOLD, OLD_THRESHOLD)
        assert gc.get_freeze_count() > 0  # what start-up built is no longer walked by full passes
        # still collected: a cycle made afterwards goes at the next young collection
        class Node:
            pass
        a, b = Node(), Node()
        a.other, b.other = b, a
        del a, b
        assert gc.collect(0) >= 2
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)
