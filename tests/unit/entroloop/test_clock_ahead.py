"""A producer whose clock is fast: its records decode (up to ENTROLOOP_EVENT_MAX_FUTURE_S ahead),
count in their own windows, and close no window early (entroloop.streams.windowing.MAX_AHEAD_OF_CLOCK_S);
the Faust worker's side is in tests/unit/streams/test_worker_bookkeeping.py.

Before, one record an hour ahead moved the watermark an hour: every window of that hour closed and
every on-time record after it was late, dropped from its fallback-rate window."""

from __future__ import annotations

import time

from entroloop.streams.fallback_rates import FallbackRateMonitor

from entroloop.contract.ids import NodeStamper
from entroloop.contract.records import Audit, Event, Fallback, Health
from entroloop.contract.settings import Settings

HOUR = 3600.0


class RecordedMonitor(FallbackRateMonitor):
    """The fallback-rate processor, keeping the windows it closes."""

    def __init__(self) -> None:
        super().__init__(grace_s=5.0)
        self.windows: list[Health] = []

    def on_watermark(self, event_time: float) -> list[Event]:
        out = super().on_watermark(event_time)
        self.windows += [r for r in out if isinstance(r, Health) and r.metric == "fallback_rate_1m"]
        return out


def _requests(stamper: NodeStamper, first: int, n: int, at: float) -> list[Event]:
    out: list[Event] = []
    for i in range(first, first + n):
        out.append(Audit(**stamper.stamp(at), request_id=f"req-{i}", audit_id=f"audit-{i}", model="m",
                         prompt=f"question {i}", response=f"answer {i}"))
        if i % 10 == 0:
            out.append(Fallback(**stamper.stamp(at), request_id=f"req-{i}", model="m", reason="timeout"))
    return out


def test_embedded_a_record_an_hour_ahead_leaves_the_on_time_records_in_their_windows(tmp_path, chdb_dsn, ch_database) -> None:
    from entroloop.runner import EmbeddedRunner

    monitor = RecordedMonitor()
    settings = Settings(data_dir=tmp_path / "data", clickhouse_dsn=chdb_dsn, clickhouse_database=ch_database,
                        audit_store="local", partitions=3)
    runner = EmbeddedRunner(settings, processors=[monitor])
    on_time, fast = NodeStamper("node-on-time"), NodeStamper("node-fast-clock")
    for record in _requests(on_time, 0, 50, time.time() - 0.5):
        runner.publish(record)
    runner.publish(Audit(**fast.stamp(time.time() + HOUR), request_id="req-fast", audit_id="audit-fast", model="m",
                         prompt="question", response="answer"))
    runner.drain()
    # The next requests, on time: the fast record must not have closed their minute.
    for record in _requests(on_time, 50, 50, time.time() - 0.5):
        runner.publish(record)
    runner.drain()
    assert monitor.late_events == 0  # was 55: the second 50 requests and their 5 fallbacks
    assert runner.events_ahead == 1
    runner.drain(end_of_stream=True)  # a finite stream's end closes every window, the fast record's too
    counted = {float(w.labels["window_start"]): int(w.labels["requests"]) for w in monitor.windows
               if w.labels["tier"] == "*"}
    fast_minute = (time.time() + HOUR) // 60 * 60
    assert sum(n for start, n in counted.items() if abs(start - fast_minute) > 120) == 100
    assert sum(n for start, n in counted.items() if abs(start - fast_minute) <= 120) == 1  # in its own window
    fallbacks = sum(int(w.labels["fallbacks"]) for w in monitor.windows if w.labels["tier"] == "*")
    assert fallbacks == 10
