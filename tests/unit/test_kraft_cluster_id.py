"""The dedicated test brokers format their storage with an id StorageTool's parser accepts."""

from __future__ import annotations

import base64

from tests.reliability.harness import kraft_cluster_id


def test_cluster_ids_never_start_with_a_dash_and_decode_to_16_bytes() -> None:
    ids = [kraft_cluster_id() for _ in range(5000)]
    assert not [i for i in ids if i.startswith("-")]
    assert all(len(base64.urlsafe_b64decode(i + "==")) == 16 for i in ids)
    assert len(set(ids)) == len(ids)
