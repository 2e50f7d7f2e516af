import uuid

from entroloop.contract.ids import NodeStamper, derived_event_id, uuid7


def test_uuid7_has_version_7_and_orders_by_time():
    a, b = uuid7(1_700_000_000.0), uuid7(1_700_000_001.0)
    assert uuid.UUID(a).version == 7 and uuid.UUID(a).variant == uuid.RFC_4122
    assert a < b


def test_derived_ids_are_deterministic_and_distinct():
    x = derived_event_id("src", "rule", 0, at=1.0)
    assert x == derived_event_id("src", "rule", 0, at=1.0)
    assert x != derived_event_id("src", "rule", 1, at=1.0)
    assert uuid.UUID(x).version == 7


def test_stamper_seq_is_monotonic_per_node():
    s = NodeStamper("n")
    seqs = [s.stamp()["seq"] for _ in range(5)]
    assert seqs == [0, 1, 2, 3, 4]
