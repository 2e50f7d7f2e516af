"""Garbage-collector settings for long-running stream processes (the Faust worker).

CPython's cyclic collector runs a young-generation pass every 700 net container allocations and,
every so often, a full pass over every object the process holds. A stream worker allocates several
containers per event (records, outputs, batches) and holds a large heap that never changes (modules,
Faust's app and consumer, the processors): in ``entroloop bench workers`` (43k events) the Faust
worker ran ~800 young and 6 full collections, the full ones ~137 ms each, about 10% of its CPU time
(timed with ``gc.callbacks``). The records hold no reference cycles, so the passes find little.

``tune_for_streaming`` freezes what start-up built (moved to the permanent generation: never walked
again) and raises the young-generation threshold to 50,000 allocations: collections stay bounded (a
cycle that something does create is still collected within a few batches), at a few per second
instead of hundreds. The same function is applied to the plain loop that ``bench workers`` compares
against, so the comparison stays about the transport.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 50_000
"""Net container allocations between young-generation collections (CPython's default: 700)."""
MIDDLE_THRESHOLD = 20
OLD_THRESHOLD = 10


def tune_for_streaming() -> tuple[int, int, int]:
    """Freeze the start-up heap and raise the collector's thresholds; returns the old thresholds."""
    previous = gc.get_threshold()
    gc.collect()  # start-up garbage goes now, not into the frozen generation
    gc.freeze()
    gc.set_threshold(YOUNG_THRESHOLD, MIDDLE_THRESHOLD, OLD_THRESHOLD)
    return previous


__all__ = ["MIDDLE_THRESHOLD", "OLD_THRESHOLD", "YOUNG_THRESHOLD", "tune_for_streaming"]
