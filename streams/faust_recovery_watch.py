"""Fetch again a changelog partition that Faust's table recovery waits for and never receives.

Found in CI (test_rebalance_second_worker_joins_then_leaves): after the second worker left, the
first one's recovery read the changelog partitions it had kept (501 records) but received nothing,
for minutes, from the ones it took back (bad_case_join-changelog 0-2, entropy_carry-changelog 2,
the snapshot changelogs' partition 0), though the broker had records there and fetch requests went
out. Faust only logs ("No event received for active tp ... since recovery start") and waits: a
worker in recovery processes no stream, so every alert of those minutes was missing. The
run could not be repeated here (21 runs under CPU load passed); Faust has several ways to lose
records fetched around a rebalance (a read offset left from an earlier assignment filters them
out, records handed over while flow is suspended are dropped, a changelog queue is cleared when
flow resumes), and after each the consumer never hands those records over again.

``stalled_recovery_check`` (run every few seconds by ``watch_recovery``, a task of the worker) finds
an active changelog partition that is behind the high watermark the recovery aims for and has
received nothing for ``RECOVERY_STALL_S``, logs what
the consumer holds for it (paused, read offset) and fetches it again from the recovery's offset:
resumed, read offset reset, sought on the consumer's own thread. Records read twice are harmless
(the recovery applies only offsets past the one it has). A recovery that is making progress is
never touched: a partition with records to give hands some over in every fetch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

from entroloop.streams.faust_offsets import seek_on_consumer_thread

log = logging.getLogger(__name__)

RECOVERY_STALL_S = 15.0
"""How long an active changelog partition behind its high watermark may receive nothing before it
is fetched again (Faust itself warns after 30 s and then waits forever)."""


def stalled_recovery_check(
    recovery: Any,
    consumer: Any,
    stall_after_s: float = RECOVERY_STALL_S,
    clock: Callable[[], float] = time.monotonic,
) -> Callable[[], list[Any]]:
    """A check over Faust's ``Recovery`` (``app.tables.recovery``): each active
    changelog partition that still has records to read and has received none for ``stall_after_s``
    (since the recovery started, its last record, or the last time this check fetched it) is fetched
    again from the recovery's offset. Returns the partitions it fetched again."""
    fetched_at: dict[Any, float] = {}

    def check() -> list[Any]:
        if not recovery.in_recovery or recovery._recovery_started_at is None:
            fetched_at.clear()
            return []
        now = clock()
        received_at = recovery._active_events_received_at
        stalled = []
        for tp, remaining in recovery.active_remaining().items():
            if remaining <= 0 or tp not in consumer.assignment():
                continue
            # Faust clears received_at when a recovery starts: a partition quiet since then has no entry.
            quiet_since = max(recovery._recovery_started_at, received_at.get(tp, float("-inf")),
                              fetched_at.get(tp, float("-inf")))
            if now - quiet_since < stall_after_s:
                continue
            offset = max(recovery.active_offsets.get(tp) or 0, 0)  # Faust's convention: -1 reads from 0
            log.warning("table recovery has received nothing from %s for %.0f s though %d records remain "
                        "(paused: %s, read offset: %s, flow active: %s): fetching it again from offset %d",
                        tp, now - quiet_since, remaining, tp in consumer._paused_partitions,
                        dict.get(consumer._read_offset, tp), consumer.flow_active, offset)
            consumer.resume_partitions([tp])
            asyncio.get_running_loop().create_task(seek_on_consumer_thread(consumer, tp, offset))
            fetched_at[tp] = now
            stalled.append(tp)
        return stalled

    return check


async def watch_recovery(app: Any, on_refetch: Callable[[int], None] = lambda n: None,
                         interval_s: float = RECOVERY_STALL_S / 3) -> None:
    """Run ``stalled_recovery_check`` on ``app`` every ``interval_s`` until the app stops, telling
    ``on_refetch`` how many partitions each run fetched again. A task of the worker, not a Faust
    timer: Faust starts timers only once the first recovery has completed, and the first one (a
    restarted worker's) can stall too."""
    check = stalled_recovery_check(app.tables.recovery, app.consumer)
    log.info("watching table recoveries: a changelog partition silent for %.0f s is fetched again", RECOVERY_STALL_S)
    while not app.should_stop:
        await asyncio.sleep(interval_s)
        try:
            fetched = check()
            if fetched:
                on_refetch(len(fetched))
        except Exception:  # a watchdog that dies leaves the stall it watches for
            log.exception("the table recovery check failed; it runs again in %.0f s", interval_s)


__all__ = ["RECOVERY_STALL_S", "stalled_recovery_check", "watch_recovery"]
