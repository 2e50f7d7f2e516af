"""The synthetic fleet's default clock stays inside the readers' event-time window on any day."""

from __future__ import annotations

import time

from entroloop.collectors.synthetic_fleet import SyntheticFleet, default_start_time

from entroloop.contract import codec
from entroloop.contract.records import DeadLetter


def test_default_start_is_two_days_back_at_a_fixed_time_of_day() -> None:
    now = 1_900_000_123.0
    start = default_start_time(now)
    assert now - 3 * 86_400 < start < now - 86_400
    assert start % 60 == 1_796_000_000 % 60  # minute alignment as with the old fixed day
    assert default_start_time(now + 100) == start  # every fleet made on one UTC day agrees


def test_fleet_records_decode_today_and_in_a_year() -> None:
    """A fixed start day would make every record a dead letter once it is older than 90 days."""
    for now in (time.time(), time.time() + 365 * 86_400):
        fleet = SyntheticFleet(seed=3, start_time=default_start_time(now))
        records = [r for request in fleet.requests(20) for r in request.records]
        decoded = [codec.decode(codec.encode(r), window=codec.EventTimeWindow(), now=now) for r in records]
        assert not [d for d in decoded if isinstance(d, DeadLetter)]
