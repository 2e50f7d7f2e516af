"""entroloop.infra.log_throttle: one line per interval, the first at once."""

from __future__ import annotations

from entroloop.infra.log_throttle import LogThrottle


def test_log_throttle_lets_one_line_through_per_interval() -> None:
    now = [100.0]
    throttle = LogThrottle(5.0, clock=lambda: now[0])
    assert throttle.due() and not throttle.due()
    now[0] += 4.9
    assert not throttle.due()
    now[0] += 0.2
    assert throttle.due() and not throttle.due()
