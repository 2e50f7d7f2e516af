"""At most one log line per interval for a condition that can fire once per record.

Why: a broker that refuses a whole topic (no write permission, a record size limit) refuses every
record sent to it, and a line per record buries the log at fleet rates. The counters (Prometheus,
``Publisher.stats``) count every record; the log says that it happens and how often so far.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class LogThrottle:
    """``due()``: True at most once per ``interval_s`` (the first call always), thread-safe."""

    def __init__(self, interval_s: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.clock = clock
        self._last: float | None = None
        self._lock = threading.Lock()

    def due(self) -> bool:
        now = self.clock()
        with self._lock:
            if self._last is not None and now - self._last < self.interval_s:
                return False
            self._last = now
            return True


__all__ = ["LogThrottle"]
