"""The embedded bus's crash-consistency building blocks: durable appends, atomic offsets, batch cuts.

The end-to-end proof (SIGKILL anywhere in ``entroloop demo``, then ``replay``) is
tests/reliability/test_embedded_crash.py; these pin down each piece it relies on.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from entroloop.infra import bus
from entroloop.infra.bus import BatchCuts, LocalLog, OffsetStore

TOPIC = "entroloop.alerts.v1"


def test_flush_makes_appends_readable_by_a_new_process_view(tmp_path: Path) -> None:
    log = LocalLog(tmp_path, partitions=1)
    for i in range(3):
        log.append(TOPIC, f"k{i}", b"v" * 10, event_id=f"e{i}")
    log.flush()
    again = LocalLog(tmp_path, partitions=1)  # what a process started after a crash would read
    assert again.read(TOPIC, 0, 0, 10) == [(f"k{i}", b"v" * 10) for i in range(3)]
    assert again.append(TOPIC, "k0", b"other", event_id="e0") is None  # the ids came back too


def test_flush_fsyncs_only_files_written_since_the_last_flush(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = LocalLog(tmp_path, partitions=2)
    log.append(TOPIC, "a", b"1", "e1")
    log.append("entroloop.audit.v1", "a", b"2", "e2")
    log.flush()
    synced: list[int] = []
    real_fsync = os.fsync
    monkeypatch.setattr(bus.os, "fsync", lambda fd: (synced.append(fd), real_fsync(fd)))
    log.flush()
    assert synced == []  # nothing new: a drain step that read nothing costs no fsync
    log.append(TOPIC, "a", b"3", "e3")
    log.append(TOPIC, "a", b"4", "e4")
    log.flush()
    assert len(synced) == 1  # one fsync for the one file written, however many records


def test_a_frame_torn_by_a_crash_is_cut_off_on_open(tmp_path: Path) -> None:
    log = LocalLog(tmp_path, partitions=1)
    log.append(TOPIC, "a", b"whole", "e1")
    log.append(TOPIC, "a", b"torn-record", "e2")
    log.close()
    path = next(tmp_path.glob("*/*.log"))
    path.write_bytes(path.read_bytes()[:-4])
    again = LocalLog(tmp_path, partitions=1)
    assert again.read(TOPIC, 0, 0, 10) == [("a", b"whole")]
    assert again.append(TOPIC, "a", b"torn-record", "e2") == (0, 1)  # the torn one can be re-sent


def test_offsets_survive_a_crash_during_save(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = OffsetStore(tmp_path / "offsets.json")
    store.commit(TOPIC, 0, 5)
    store.save()
    store.commit(TOPIC, 0, 9)

    def crash(*_args: object) -> None:
        raise KeyboardInterrupt("killed between writing the new file and renaming it")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(KeyboardInterrupt):
        store.save()
    monkeypatch.undo()
    assert OffsetStore(tmp_path / "offsets.json").get(TOPIC, 0) == 5  # the last complete save, whole
    store.save()
    assert OffsetStore(tmp_path / "offsets.json").get(TOPIC, 0) == 9
    assert sorted(p.name for p in tmp_path.iterdir()) == ["offsets.json"]  # no temporary file left


def test_a_re_read_cuts_the_batches_of_the_first_read(tmp_path: Path) -> None:
    """A derived partition read while it grows (37, then 100 records) is re-read in the same batches."""
    first = BatchCuts(tmp_path / "cuts.json", batch_size=40)
    assert first.plan(TOPIC, 0, 0, 37) == [(0, 37)]
    first.save()
    assert first.plan(TOPIC, 0, 37, 100) == [(37, 40), (40, 80), (80, 100)]
    first.save()
    replay = BatchCuts(tmp_path / "cuts.json", batch_size=40)
    # without the journal a replay would read (0, 40): another insert token, counted twice by rollups
    assert replay.plan(TOPIC, 0, 0, 100) == [(0, 37), (37, 40), (40, 80), (80, 100)]
    before = (tmp_path / "cuts.json").stat().st_mtime_ns
    replay.save()
    assert (tmp_path / "cuts.json").stat().st_mtime_ns == before  # nothing new: not rewritten


def test_batch_cuts_hold_when_the_batch_size_changes(tmp_path: Path) -> None:
    BatchCuts(tmp_path / "cuts.json", batch_size=40).plan(TOPIC, 1, 0, 90)
    cuts = BatchCuts(tmp_path / "cuts.json", batch_size=40)
    cuts.plan(TOPIC, 1, 0, 90)
    cuts.save()
    assert json.loads((tmp_path / "cuts.json").read_text()) == {f"{TOPIC}:1": [40, 80, 90]}
    assert BatchCuts(tmp_path / "cuts.json", batch_size=1000).plan(TOPIC, 1, 0, 120) == [(0, 40), (40, 80), (80, 90), (90, 120)]
