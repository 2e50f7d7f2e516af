"""entroloop.infra.partition_drain: when a run-until-idle loop may stop."""

from __future__ import annotations

from types import SimpleNamespace

from entroloop.infra.partition_drain import DrainWatch


def _partitions(*numbers: int) -> list[SimpleNamespace]:
    return [SimpleNamespace(partition=n) for n in numbers]


def test_drained_only_when_every_assigned_partition_is_at_its_end() -> None:
    watch = DrainWatch()
    assert not watch.drained  # holds nothing yet: waiting to be given partitions is not idle
    watch.on_assign(None, _partitions(0, 1))
    watch.reached_end(0)
    assert not watch.drained
    watch.reached_end(1)
    assert watch.drained
    watch.got_record(1)  # a record after the end: partition 1 has more
    assert not watch.drained


def test_a_revoked_partition_takes_its_end_mark_with_it() -> None:
    watch = DrainWatch()
    watch.on_assign(None, _partitions(0, 1))
    watch.reached_end(0)
    watch.on_revoke(None, _partitions(0))
    assert watch.assigned == {1} and watch.at_end == set()
    assert not watch.drained
    watch.on_revoke(None, _partitions(1))
    assert not watch.drained  # lost everything: not drained, waiting
    watch.on_assign(None, _partitions(0))
    assert not watch.drained  # the old end mark of 0 is gone: it must be reached again
