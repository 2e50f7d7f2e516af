"""Distributed training data (chDB + the WORM audit log): accepted answers chosen in ClickHouse and
read back by audit id, text already redacted; bad cases from ClickHouse's bad_cases table."""

from __future__ import annotations

import time
from pathlib import Path

from entroloop.sinks.audit.parquet_writer import AuditParquetWriter
from entroloop.sinks.clickhouse.writer import ClickHouseSink
from entroloop.training.dataset import REPLAY, build_dataset
from entroloop.training.pipeline import select_training_records, source_records
from entroloop.training.sources import WarehouseSource

from entroloop.contract.ids import NodeStamper
from entroloop.contract.records import (
    Audit,
    BadCase,
    Fallback,
    Feedback,
    RetrainRequest,
)
from entroloop.infra.pii import PiiRedactor
from entroloop.infra.worm.worm_store import LocalWormStore

RAW_EMAIL = "alice.smith@example.com"


def _fixture(chdb_client, database: str, folder: Path):
    """30 audited answers of model-a in three audit files, plus the ones that must not be replayed."""
    stamper = NodeStamper("gw-1")
    redactor = PiiRedactor("test-key")  # the gateway redacts before the Audit record exists
    now = time.time()

    def audit(i: int, model: str = "model-a", at: float | None = None) -> Audit:
        prompt = redactor.redact(f"question {i}: mail me at {RAW_EMAIL}")
        return Audit(**stamper.stamp(at or now - 100 + i), request_id=f"r{i}", audit_id=f"a-r{i}", model=model,
                     prompt=prompt.text, response=f"answer {i}", redactions=prompt.counts, sampling={"temperature": 0.0})

    accepted = [audit(i) for i in range(30)]
    negative, corrected, fell_back = audit(30), audit(31), audit(32)
    other_model, too_late = audit(33, model="model-b"), audit(34, at=now + 3600)
    audits = [*accepted, negative, corrected, fell_back, other_model, too_late]
    sink = ClickHouseSink(chdb_client, database)
    sink.write(Audit.topic, 0, 0, len(audits) - 1, audits)
    writer = AuditParquetWriter(LocalWormStore(folder))
    for first in range(0, len(audits), 12):  # three batches: three files in the chain
        batch = audits[first:first + 12]
        writer.write(Audit.topic, 0, first, first + len(batch) - 1, batch)
    sink.write(Feedback.topic, 0, 0, 1, [Feedback(**stamper.stamp(), request_id="r30", rating=-1),
                                         Feedback(**stamper.stamp(), request_id="r5", rating=5)])
    sink.write(Fallback.topic, 0, 0, 0, [Fallback(**stamper.stamp(), request_id="r32", model="model-a",
                                                  reason="low_intent")])
    bad = [BadCase(**stamper.stamp(now - 10 + i), request_id=f"b{i}", model="model-a", prompt=f"bad prompt {i}",
                   response="wrong", correction=f"right {i}") for i in range(3)]
    bad.append(BadCase(**stamper.stamp(now - 5), request_id="r31", audit_id="a-r31", model="model-a",
                       prompt=corrected.prompt, response=corrected.response, correction="the corrected answer"))
    bad.append(BadCase(**stamper.stamp(now), request_id="x", model="model-b", prompt="p", response="r", correction="c"))
    sink.write(BadCase.topic, 0, 0, len(bad) - 1, bad)
    request = RetrainRequest(**stamper.stamp(), request_id="k", trigger_key="model-a/format/1", model="model-a",
                             category="format", reason="error_rate", window_end=now + 60)
    return request, {a.audit_id: a for a in accepted}


def test_accepted_traffic_by_audit_id_and_bad_cases_from_clickhouse(chdb_client, ch_database, tmp_path) -> None:
    request, accepted = _fixture(chdb_client, ch_database, tmp_path / "worm")
    source = WarehouseSource(chdb_client, ch_database, LocalWormStore(tmp_path / "worm"), replay_ratio=1.0,
                             oversample=2.0)

    records = list(source_records(source, request))

    bad = [r for r in records if isinstance(r, BadCase)]
    audits = [r for r in records if isinstance(r, Audit)]
    assert sorted(b.correction for b in bad) == ["right 0", "right 1", "right 2", "the corrected answer"]
    assert len(audits) == 8 == source.last_stats["replay_ids"]  # 4 corrections x ratio 1 x oversample 2
    for a in audits:  # read back from the audit log, equal to what was written, and only accepted ones
        assert a.audit_id in accepted
        written = accepted[a.audit_id]  # the log keeps emitted_at in milliseconds
        assert _fields(a) == {**_fields(written), "emitted_at": _fields(a)["emitted_at"]}
        assert abs(a.emitted_at - written.emitted_at) < 0.001
        assert RAW_EMAIL not in a.prompt and "[EMAIL:" in a.prompt and a.redactions == {"email": 1}
    # the same job samples the same ids; another trigger key samples others
    assert source.accepted_audit_ids(request, 8) == [a.audit_id for a in audits]
    other = source.accepted_audit_ids(RetrainRequest(**{**_fields(request), "trigger_key": "model-a/facts/2"}), 8)
    assert set(other) <= set(accepted) and other != [a.audit_id for a in audits]
    # every accepted answer is eligible, the excluded ones never are
    assert set(source.accepted_audit_ids(request, 1000)) == set(accepted)

    data = build_dataset(*select_training_records(records, request), replay_ratio=1.0, seed=request.trigger_key)
    assert data.stats["corrections"] == 4 and data.stats["replay"] == 4
    replay = [e for e in data.train + data.heldout if e.source == REPLAY]
    assert all(e.origin in accepted and RAW_EMAIL not in e.prompt for e in replay)


def test_a_negative_verdict_excludes_an_answer_only_from_its_own_tenant(chdb_client, ch_database, tmp_path) -> None:
    """verdict_applies in SQL: the owner's thumbs-down, or one without a tenant, excludes the answer; another
    tenant's (it learned the request id) does not; an answer served without a tenant has no owner."""
    stamper = NodeStamper("gw-1")
    now = time.time()
    served = {"t-rival": "acme", "t-owner": "acme", "t-legacy": "acme", "t-none": "", "t-kept": "acme"}
    audits = [Audit(**stamper.stamp(now - 50), request_id=rid, audit_id=f"a-{rid}", model="model-a",
                    tenant=tenant, prompt=f"prompt {rid}", response="answer") for rid, tenant in served.items()]
    sink = ClickHouseSink(chdb_client, ch_database)
    sink.write(Audit.topic, 0, 0, len(audits) - 1, audits)
    verdicts = {"t-rival": "rival", "t-owner": "acme", "t-legacy": "", "t-none": "rival"}
    feedback = [Feedback(**stamper.stamp(), request_id=rid, rating=-2, tenant=tenant) for rid, tenant in verdicts.items()]
    feedback.append(Feedback(**stamper.stamp(), request_id="t-kept", rating=3, tenant="acme"))
    sink.write(Feedback.topic, 0, 0, len(feedback) - 1, feedback)
    request = RetrainRequest(**stamper.stamp(), request_id="k", trigger_key="model-a/format/9", model="model-a",
                             category="format", reason="error_rate", window_end=now + 60)
    source = WarehouseSource(chdb_client, ch_database, LocalWormStore(tmp_path / "worm"))

    assert sorted(source.accepted_audit_ids(request, 100)) == ["a-t-kept", "a-t-rival"]


def _fields(record) -> dict:
    return {f: getattr(record, f) for f in record.__struct_fields__}


def test_cli_picks_the_warehouse_source_in_distributed_mode(chdb_client, ch_database, tmp_path) -> None:
    from types import SimpleNamespace

    from entroloop.training.pipeline import BusSource, JsonLinesSource

    from entroloop.cli.training import _source
    from entroloop.contract.settings import Settings

    request, accepted = _fixture(chdb_client, ch_database, tmp_path / "data" / "worm")
    registry = SimpleNamespace(client=chdb_client, database=ch_database)
    distributed = Settings(data_dir=tmp_path / "data", kafka_bootstrap="127.0.0.1:9", audit_store="local")
    source = _source(distributed, None, registry)
    assert isinstance(source, WarehouseSource)
    audits = [r for r in source.records_for(request) if isinstance(r, Audit)]
    assert audits and {a.audit_id for a in audits} <= set(accepted)
    embedded = Settings(data_dir=tmp_path / "data", kafka_bootstrap="")
    assert isinstance(_source(embedded, None, registry), BusSource)
    assert isinstance(_source(distributed, [tmp_path / "r.jsonl"], registry), JsonLinesSource)
