"""A user's correction and comment are redacted before they are kept or stored (issue 12).

The gateway redacts prompts and answers, but the correction text of a Feedback reached the join
state and the ``bad_cases`` table in clear. These tests glue PII to Chinese text (as users write
it), join, write through the real ClickHouse sink (chDB) and look for the raw values everywhere.
"""

from __future__ import annotations

import time
import uuid

from entroloop.sinks.clickhouse.writer import ClickHouseSink
from entroloop.streams.bad_cases import BadCaseJoiner, encode_entry

from entroloop.contract.records import BadCase, Feedback
from entroloop.infra.pii import PiiRedactor

from .analytics_records import audit, feedback

KEY = "shared-gateway-and-joiner-key"
PHONE, EMAIL, CARD = "13900001111", "bob.jones@example.org", "6222021234567890128"
RAW = (PHONE, EMAIL, CARD, "bob.jones")
CORRECTION = f"请拨打{PHONE}或发邮件到{EMAIL}，卡号{CARD}已冻结。"
COMMENT = f"我的手机号{PHONE}，别再打错了"


def _gateway_audit(request_id: str, redactor: PiiRedactor, at: float = 1000.0):
    """An Audit as the gateway builds it: prompt and response already redacted."""
    response = redactor.redact(f"请拨打13800002222或发邮件到{EMAIL}，卡号{CARD}已冻结。").text
    return audit(request_id, prompt=redactor.redact(f"我的邮箱{EMAIL}，帮我查卡").text, response=response, at=at)


def _no_raw(text: str) -> bool:
    return not any(value in text for value in RAW)


def test_correction_and_comment_are_redacted_in_the_bad_case_and_the_join_state() -> None:
    redactor = PiiRedactor(KEY)
    joiner = BadCaseJoiner(redactor=redactor)
    fb = feedback("r1", corrected=CORRECTION, rating=1, comment=COMMENT)
    assert joiner.process(fb) == []  # feedback first: it waits in the join state
    state_bytes = encode_entry(joiner.state["r1"])
    assert not any(value.encode() in state_bytes for value in RAW)
    waiting: Feedback = joiner.state["r1"].waiting_feedback[0]
    assert _no_raw(waiting.comment) and "[PHONE:" in waiting.comment

    (case,) = joiner.process(_gateway_audit("r1", redactor))
    assert isinstance(case, BadCase)
    assert _no_raw(case.correction) and _no_raw(case.prompt) and _no_raw(case.response)
    assert all(_no_raw(old) and _no_raw(new) for _op, old, new in case.diff)
    # Same key as the gateway: the e-mail and card placeholders match, so the diff blames only the
    # phone number the user corrected, not PII that did not change.
    for unchanged in (redactor.redact(EMAIL).text, redactor.redact(f"卡号{CARD}").text[2:]):
        assert unchanged in case.response and unchanged in case.correction
    changed = "".join(old + new for _op, old, new in case.diff)
    assert case.diff and set(changed) <= set("0123456789abcdef")  # only the phone pseudonym's hex


def test_audit_first_and_build_redact_too() -> None:
    redactor = PiiRedactor(KEY)
    joiner = BadCaseJoiner(redactor=redactor)
    joiner.process(_gateway_audit("r2", redactor))
    (case,) = joiner.process(feedback("r2", corrected=CORRECTION, rating=1))
    assert _no_raw(case.correction)
    # build() is what replays call directly: it redacts as well, raw audit included.
    rebuilt = joiner.build(audit("r2", prompt=f"邮箱{EMAIL}", response=CORRECTION), feedback("r2", corrected=CORRECTION))
    assert _no_raw(rebuilt.prompt) and _no_raw(rebuilt.response) and _no_raw(rebuilt.correction)


def test_no_raw_pii_reaches_clickhouse(chdb_client) -> None:
    """Bad cases and feedback through the real sink: no String column holds a raw value."""
    database = f"t_{uuid.uuid4().hex[:12]}"
    redactor = PiiRedactor(KEY)
    joiner = BadCaseJoiner(redactor=redactor)
    now = time.time()  # the tables' TTL drops rows of 1970
    fb = feedback("r3", corrected=CORRECTION, rating=1, comment=COMMENT, at=now)
    joiner.process(fb)
    cases = joiner.process(_gateway_audit("r3", redactor, at=now))
    sink = ClickHouseSink(chdb_client, database)
    sink.write(BadCase.topic, 0, 0, 0, cases)
    sink.write(Feedback.topic, 0, 0, 0, [fb])
    for table in ("bad_cases", "feedback"):
        rows = chdb_client.query(f"SELECT * FROM {database}.{table}").result_rows
        assert len(rows) == 1
        assert all(_no_raw(str(cell)) for cell in rows[0]), (table, rows[0])
    chdb_client.command(f"DROP DATABASE IF EXISTS {database}")


def test_the_joiner_from_settings_uses_the_shared_key(caplog, monkeypatch) -> None:
    """Same ENTROLOOP_PII_HASH_KEY as the gateway: same pseudonyms. Without it: a warning (once
    per process: earlier tests may have built an unkeyed joiner, so the record is reset here)."""
    from pydantic import SecretStr

    from entroloop.contract.settings import Settings
    from entroloop.infra import pii

    monkeypatch.setattr(pii, "_WARNED_WITHOUT_KEY", set())

    keyed = BadCaseJoiner.from_settings(Settings(pii_hash_key=SecretStr(KEY)))
    assert keyed.redactor.redact_text(EMAIL) == PiiRedactor(KEY).redact_text(EMAIL)
    with caplog.at_level("WARNING"):
        unkeyed = BadCaseJoiner.from_settings(Settings(mode="production"))
    assert unkeyed.redactor.ephemeral and "ENTROLOOP_PII_HASH_KEY" in caplog.text
