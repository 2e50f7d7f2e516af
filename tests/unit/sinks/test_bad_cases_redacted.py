"""Text stored outside the write-once log is PII-redacted: the `bad_cases` rows in ClickHouse.

Issue 12, finding 2: `bad_cases` holds prompt, response and correction text and any analyst can
query it; the user's correction reached it with no redaction step. The audit and the feedback below
carry raw PII in every free-text field (an audit from a collector without redaction, a correction
and a comment typed by the user, PII glued to Chinese text); the joiner the pipeline runs
(`entroloop.streams.defaults.default_processors`) builds the bad case, the ClickHouse sink stores it, and no
column of the stored row may hold any of it.
"""

from __future__ import annotations

import time

from entroloop.sinks.clickhouse.writer import ClickHouseSink
from entroloop.streams.bad_cases import BadCaseJoiner
from entroloop.streams.defaults import default_processors

from entroloop.contract.ids import derived_event_id
from entroloop.contract.records import Audit, BadCase, Feedback
from entroloop.contract.settings import load_settings

PII = {
    "mobile": "13900001111",
    "email": "bob.jones@example.org",
    "landline": "010-62345678",
    "id_card": "11010519491231002X",
}
PROMPT = f"我的手机号{PII['mobile']}，邮箱是{PII['email']}谢谢。订单怎么退款？"
RESPONSE = f"您好，请拨打{PII['landline']}联系客服，我们会发邮件到{PII['email']}。"
CORRECTION = f"请直接回复{PII['mobile']}的用户：身份证{PII['id_card']}已核验，退款三个工作日到账。"


def records(at: float) -> tuple[Audit, Feedback]:
    common = {"emitted_at": at, "node_id": "node-1", "request_id": "req-pii-1", "trace_id": "0" * 32}
    audit = Audit(event_id=derived_event_id("req-pii-1", "audit", at=at), seq=1, audit_id="aud-1", model="m",
                  prompt=PROMPT, response=RESPONSE, **common)
    feedback = Feedback(event_id=derived_event_id("req-pii-1", "feedback", at=at), seq=2, rating=-1,
                        error_type="wrong_answer", corrected_answer=CORRECTION,
                        comment=f"call me at {PII['mobile']}", **common)
    return audit, feedback


def test_stored_bad_cases_hold_no_raw_pii(chdb_client, ch_database, tmp_path, monkeypatch):
    monkeypatch.setenv("ENTROLOOP_DATA_DIR", str(tmp_path))
    settings = load_settings()
    (joiner,) = [p for p in default_processors(settings) if isinstance(p, BadCaseJoiner)]
    audit, feedback = records(time.time())
    cases = joiner.process(audit) + joiner.process(feedback)
    (case,) = [c for c in cases if isinstance(c, BadCase)]

    ClickHouseSink(chdb_client, ch_database).write(BadCase.topic, 0, 0, 0, [case])
    row = chdb_client.query(f"SELECT * FROM {ch_database}.bad_cases FINAL").result_rows
    assert len(row) == 1
    stored = " ".join(str(v) for v in row[0])
    leaked = {kind: value for kind, value in PII.items() if value in stored}
    assert not leaked, f"raw PII in bad_cases: {leaked}"
    # the rows still say what the case is about (the redactor replaces, it does not blank)
    assert "退款" in stored and case.labels is not None
