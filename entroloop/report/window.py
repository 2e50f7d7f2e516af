"""The report's time window: ``--since`` / ``--until`` as ISO 8601 moments or durations before now.

Every section of the report reads only rows inside ``[since, until)`` (half-open, so two adjacent
windows never count an event twice). A bound that is not given leaves that side open: no option at
all is the whole store. A moment without a zone is UTC, the zone of every stored timestamp.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import datetime, timezone

UNIT_SECONDS = {"s": 1, "m": 60, "h": 3_600, "d": 86_400, "w": 604_800}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*$", re.IGNORECASE)
EXAMPLES = "an ISO 8601 moment (2026-12-01T09:30:00Z, 2026-12-01) or a duration before now (90s, 30m, 24h, 7d, 2w)"


class WindowError(ValueError):
    """A bound that cannot be read, or a window that ends before it starts; the message names the option."""


def parse_moment(text: str, option: str, now: float) -> float:
    """Unix seconds for ``text``: ``now`` minus a duration (``24h``), ``now``, or an ISO 8601 moment."""
    value = text.strip()
    if value.lower() == "now":
        return now
    duration = _DURATION.match(value)
    if duration:
        return now - float(duration[1]) * UNIT_SECONDS[duration[2].lower()]
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise WindowError(f"{option} {text!r}: expected {EXAMPLES}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=timezone.utc)
    return moment.timestamp()


@dataclass(frozen=True)
class ReportWindow:
    """``[since, until)`` in unix seconds; ``None`` leaves that side open."""

    since: float | None = None
    until: float | None = None

    @classmethod
    def parse(cls, since: str | None, until: str | None, now: float | None = None) -> ReportWindow:
        """The window of the command-line options; raises ``WindowError`` naming the bad option."""
        now = time.time() if now is None else now
        start = parse_moment(since, "--since", now) if since else None
        end = parse_moment(until, "--until", now) if until else None
        if start is not None and end is not None and end <= start:
            raise WindowError(
                f"--until ({_utc(end)}) is not after --since ({_utc(start)}): the window would be empty"
            )
        return cls(start, end)

    @property
    def bounded(self) -> bool:
        return self.since is not None or self.until is not None

    def sql(self, column: str) -> str:
        """A ClickHouse condition keeping ``column`` (a DateTime64) inside the window (``1`` if open)."""
        parts = []
        if self.since is not None:
            parts.append(f"{column} >= toDateTime64({self.since:.6f}, 6, 'UTC')")
        if self.until is not None:
            parts.append(f"{column} < toDateTime64({self.until:.6f}, 6, 'UTC')")
        return " AND ".join(parts) or "1"

    def describe(self) -> str:
        """The window in words for the page header."""
        if not self.bounded:
            return "all stored events (no --since / --until)"
        start = _utc(self.since) if self.since is not None else "the first stored event"
        end = _utc(self.until) if self.until is not None else "now"
        return f"from {start} to {end}"


def _utc(t: float) -> str:
    return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


__all__ = ["ReportWindow", "WindowError", "parse_moment"]
