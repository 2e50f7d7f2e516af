"""Reading records back from the audit log: by one narrow key, nothing else.

The compliance brief allows exactly these lookups, per record type (``RecordLayout.lookups``):

* audit records by ``audit_id`` or ``user_id`` (an auditor's "show me this answer" and a data
  subject's "show me everything about me");
* action records by ``action_id`` or ``alert_key`` ("show me this action" and "show me everything
  done about this alert", or, for the retraining loop, about this trigger key or adapter).

There is deliberately no free-text search over prompts, responses or action details. Only files
named by a manifest of the record type's own chains are read, so a file slipped into the store is
never served as evidence. Row-group statistics let Parquet skip most of each file.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from entroloop.contract.records import Action, Audit
from entroloop.infra.worm.layouts import layout_for
from entroloop.infra.worm.manifest import MANIFEST_PREFIX, Manifest, chain_prefix
from entroloop.infra.worm.parquet_bytes import read_matching
from entroloop.infra.worm.worm_store import WormStore

LOOKUP_COLUMNS = layout_for(Audit.topic).lookups
ACTION_LOOKUP_COLUMNS = layout_for(Action.topic).lookups


def manifest_files(store: WormStore, topic: str | None = None) -> list[str]:
    """Every data file the manifests name (of ``topic``'s chains only, if given), in chain order."""
    keys = []
    for key in store.list(chain_prefix(topic) if topic else MANIFEST_PREFIX):
        manifest = Manifest.from_bytes(store.get(key))
        if topic is None or manifest.topic == topic:  # the key says so; the signed-off content decides
            keys.extend(f.key for f in manifest.files)
    return keys


def find_records(store: WormStore, column: str, value: str, topic: str = Audit.topic) -> Iterator[dict[str, Any]]:
    """Records of ``topic`` (audit records unless told) whose ``column`` equals ``value``;
    ``column`` must be one of the topic's lookups."""
    return find_records_for_keys(store, column, [value], topic)


def find_records_for_keys(store: WormStore, column: str, values: Iterable[str],
                          topic: str = Audit.topic) -> Iterator[dict[str, Any]]:
    """Records of ``topic`` whose ``column`` equals one of ``values``, in chain order.

    The same narrow lookup as ``find_records`` (exact keys of one lookup column, never a pattern),
    for many keys at once: the manifests are listed once and each file is read once, so a training
    job's replay sample of n audit ids costs one pass over the log instead of n passes.
    """
    lookups = layout_for(topic).lookups
    if column not in lookups:
        raise ValueError(f"records of {topic} are read back by {' or '.join(lookups)} only")
    wanted = sorted({str(v) for v in values if str(v)})  # "" is nobody's id (records without a user have "")
    if not wanted:
        return
    for key in manifest_files(store, topic):
        # on this thread: Arrow's pools, once started, can abort a short-lived reader at exit
        table = read_matching(store.get(key), column, wanted)
        for row in table.to_pylist():
            row["emitted_at"] = row["emitted_at"].timestamp()
            row["_object"] = key
            yield row


def find_actions(store: WormStore, column: str, value: str) -> Iterator[dict[str, Any]]:
    """Action records whose ``column`` (``action_id`` or ``alert_key``) equals ``value``."""
    return find_records(store, column, value, topic=Action.topic)


__all__ = [
    "ACTION_LOOKUP_COLUMNS", "LOOKUP_COLUMNS", "find_actions", "find_records", "find_records_for_keys",
    "manifest_files",
]
