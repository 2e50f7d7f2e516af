"""An audit stored in parts is one request in ``requests_1m`` (migration 0008), and ``audit_index``
keeps each part's number and the answer's outcome."""

from __future__ import annotations

import msgspec
from entroloop.sinks.clickhouse.writer import ClickHouseSink

from entroloop.contract.records import Audit
from tests.unit.sinks.sink_records import sample_records


def test_a_request_in_parts_counts_once_and_keeps_its_parts(chdb_client, ch_database) -> None:
    whole = sample_records(5, seed=21)[Audit.topic]
    big = whole[0]
    parts = [msgspec.structs.replace(big, event_id=f"{big.event_id[:-4]}{i:04d}", seq=big.seq + 1000 + i,
                                     part_index=i, part_count=3, outcome="upstream_error",
                                     response=big.response + f" part {i}")
             for i in range(3)]
    sink = ClickHouseSink(chdb_client, ch_database)
    sink.write(Audit.topic, 0, 0, len(whole) + 2, whole[1:] + parts)
    q = chdb_client.query
    assert q(f"SELECT sum(requests) FROM {ch_database}.requests_1m").result_rows[0][0] == 5
    rows = q(f"SELECT part_index, part_count, outcome FROM {ch_database}.audit_index FINAL "
             f"WHERE audit_id = '{big.audit_id}' ORDER BY part_index").result_rows
    assert rows == [(0, 3, "upstream_error"), (1, 3, "upstream_error"), (2, 3, "upstream_error")]
    chars = q(f"SELECT sum(response_chars) FROM {ch_database}.requests_1m").result_rows[0][0]
    assert chars == sum(len(a.response) for a in whole[1:] + parts)
