"""The shared routing decision (entroloop/infra/adapter_routing.py): shares, stickiness, rollback, and the
one query that rebuilds routing from ClickHouse's adapter_status history."""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime

import pytest
from entroloop.training.publisher import CanaryRouter

from entroloop.infra.adapter_routing import (
    AdapterRouting,
    bucket,
    read_routings,
    routings_from_rows,
)
from entroloop.infra.clickhouse.schema import migrate

KEYS = [f"user-{i}" for i in range(20_000)]


@pytest.mark.parametrize("share", [0.03, 0.3, 0.5, 1.0])
def test_canary_share_is_honoured_over_many_keys(share: float) -> None:
    routing = AdapterRouting("base", stable="prod-lora").with_canary("canary-lora", share)
    served = [routing.choose(k) for k in KEYS]
    canary = served.count("canary-lora") / len(KEYS)
    # binomial: within 4 standard deviations (a wrong hash or comparison is off by far more)
    assert abs(canary - share) <= 4 * math.sqrt(share * (1 - share) / len(KEYS)) + 1e-9
    assert set(served) <= {"canary-lora", "prod-lora"}
    assert served.count("prod-lora") == len(KEYS) - served.count("canary-lora")


def test_choice_is_sticky_and_widening_keeps_the_canary_users() -> None:
    narrow = AdapterRouting("base").with_canary("c", 0.03)
    wide = narrow.with_canary("c", 0.3)
    first = [narrow.choose(k) for k in KEYS]
    assert first == [AdapterRouting("base").with_canary("c", 0.03).choose(k) for k in KEYS]  # a new state, same answer
    on_canary = {k for k, m in zip(KEYS, first, strict=True) if m == "c"}
    assert on_canary and all(wide.choose(k) == "c" for k in on_canary)  # 3% of users stay on it at 30%
    assert all(0.0 <= bucket(k) < 1.0 for k in KEYS[:1000])


def test_canary_cut_to_zero_routes_to_the_promoted_adapter_or_the_base_model() -> None:
    with_parent = AdapterRouting("base", stable="parent").with_canary("child", 0.5)
    assert {with_parent.choose(k) for k in KEYS[:2000]} == {"parent", "child"}
    assert {with_parent.without_canary().choose(k) for k in KEYS[:2000]} == {"parent"}
    assert {with_parent.with_canary("child", 0.0).choose(k) for k in KEYS[:2000]} == {"parent"}
    no_parent = AdapterRouting("base").with_canary("child", 0.5)
    assert {no_parent.without_canary().choose(k) for k in KEYS[:2000]} == {"base"}
    # promoting the base model's own name means "no adapter"
    assert with_parent.promoted("base") == AdapterRouting("base")
    assert AdapterRouting("base").with_canary("c", 7.0).share == 1.0


def test_canary_router_makes_the_shared_decision() -> None:
    router = CanaryRouter("base", stable="parent")
    router.set_canary("child", 0.3)
    state = AdapterRouting("base", stable="parent", canary="child", share=0.3)
    assert router.state == state
    assert [router.choose(k) for k in KEYS[:3000]] == [state.choose(k) for k in KEYS[:3000]]
    assert CanaryRouter.from_routing("base", {"model": "m", "stable": "", "canary": "child", "share": 0.3}).state \
        == AdapterRouting("base", canary="child", share=0.3)


def test_rows_fold_into_each_models_routing() -> None:
    rows = [  # latest status per adapter, oldest change first
        ("m", "a1", "superseded", 0.0), ("m", "a2", "promoted", 1.0), ("m", "a3", "canary", 0.30000001192),
        ("n", "b1", "rolled_back", 0.0), ("n", "b2", "candidate", 0.0),
    ]
    assert routings_from_rows(rows) == {
        "m": AdapterRouting("m", stable="a2", canary="a3", share=0.3),
        "n": AdapterRouting("n"),
    }


def test_read_routings_from_clickhouse(chdb_client, ch_database) -> None:
    migrate(chdb_client, ch_database)

    def adapter(adapter_id: str, model: str) -> None:
        chdb_client.insert(f"{ch_database}.adapters", [[adapter_id, datetime.now(UTC), model]],
                           column_names=["adapter_id", "registered_at", "model"])

    def status(adapter_id: str, value: str, share: float = 0.0) -> None:
        chdb_client.insert(f"{ch_database}.adapter_status", [[adapter_id, datetime.now(UTC), value, share]],
                           column_names=["adapter_id", "at", "status", "share"])
        time.sleep(0.002)

    for adapter_id, model in (("p", "m"), ("c", "m"), ("x", "other")):
        adapter(adapter_id, model)
    adapter("p", "m")  # a retried registration: the same row twice before a merge
    status("p", "candidate")
    status("p", "promoted", 1.0)
    status("c", "canary", 0.5)
    status("x", "canary", 0.03)
    assert read_routings(chdb_client, ch_database) == {
        "m": AdapterRouting("m", stable="p", canary="c", share=0.5),
        "other": AdapterRouting("other", canary="x", share=0.03),
    }
    status("c", "rolled_back")
    assert read_routings(chdb_client, ch_database, "m") == {"m": AdapterRouting("m", stable="p")}
    assert read_routings(chdb_client, ch_database, "unknown") == {"unknown": AdapterRouting("unknown")}
