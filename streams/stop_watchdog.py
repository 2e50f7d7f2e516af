"""A worker that hangs while stopping exits anyway, with a code that says so.

Found with an injected fault (tests/integration/test_worker_fetcher_crash.py): when Faust's Fetcher
crashes (an exception out of aiokafka's ``fetched_records``; in CI it was a ``KeyError`` from a
seek on the wrong thread), mode starts stopping the worker, and the stop then waits for ever on the
consumer thread, which has already gone. The process stayed alive, consumed nothing, published no
health, and ignored SIGTERM, so no supervisor restarted it. A worker that is stopping has nothing
left to lose by exiting: offsets are committed only after the outputs were flushed, so its
uncommitted records go to the next member of the group (at-least-once, absorbed by the sinks).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

EXIT_STOP_HUNG = os.EX_SOFTWARE  # 70: distinct from a clean crash (1) so an operator can tell them apart


def arm_stop_watchdog(grace_s: float, reason: Callable[[], str],
                      exit_process: Callable[[int], None] = os._exit) -> threading.Timer:
    """Exit the process with ``EXIT_STOP_HUNG`` unless it ended within ``grace_s`` seconds.

    The timer is a daemon thread, so a worker that stops in time exits with its own code. ``reason``
    is called when the timer fires (what the worker was stopping for, e.g. the crash). ``os._exit``
    because the event loop that a normal exit would wind down is the thing that hangs.
    """

    def fire() -> None:
        log.critical("the worker did not stop within %g s after %s; exiting with code %d so its supervisor "
                     "restarts it (its uncommitted records go to the next worker)", grace_s, reason(), EXIT_STOP_HUNG)
        for handler in logging.getLogger().handlers:
            handler.flush()
        sys.stderr.flush()
        sys.stdout.flush()
        exit_process(EXIT_STOP_HUNG)

    timer = threading.Timer(grace_s, fire)
    timer.name = "stop-watchdog"
    timer.daemon = True
    timer.start()
    return timer


__all__ = ["EXIT_STOP_HUNG", "arm_stop_watchdog"]
