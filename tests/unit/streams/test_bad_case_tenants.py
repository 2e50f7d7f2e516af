"""A tenant corrects only its own answers: the bad-case join refuses another tenant's correction.

Request ids travel in response headers and logs; before ``Feedback.tenant`` the join matched by
``request_id`` alone, so tenant B could post a correction on tenant A's answer and it became one of
A's bad cases (regression suite, retraining data). Driven here through the real gateway app (keys
of two tenants) and the joiner, records passed through the codec as on Kafka.
"""

from __future__ import annotations

import httpx
from entroloop.collectors.gateway.app import GatewayConfig, create_app
from entroloop.collectors.gateway.auth import ApiKeys
from entroloop.streams.bad_cases import BadCaseJoiner
from starlette.testclient import TestClient

from entroloop.contract.codec import decode, encode
from entroloop.contract.records import Audit, BadCase, DeadLetter, Feedback
from entroloop.infra.pii import PiiRedactor

from .analytics_records import audit, feedback

RESPONSE = "您的账户余额为120.00元，到期日2024-03-05。"
CORRECTION = "您的账户余额为150.00元，到期日2024-03-05。"
ACME_KEY = "acme-0123456789abcdef-key"
BETA_KEY = "beta-0123456789abcdef-key"


def _kinds(records: list) -> list[type]:
    return [type(r) for r in records]


def test_a_correction_from_another_tenant_is_a_dead_letter_in_either_arrival_order() -> None:
    served = audit("r1", response=RESPONSE, tenant="acme")
    foreign = feedback("r1", corrected=CORRECTION, tenant="beta", user_id="u-b")
    audit_first = BadCaseJoiner()
    assert audit_first.process(served) == []
    (letter,) = audit_first.process(foreign)
    feedback_first = BadCaseJoiner()
    assert feedback_first.process(foreign) == []  # waits for its audit, as any feedback does
    (late,) = feedback_first.process(served)
    assert encode(letter) == encode(late)  # same record whichever came first
    assert isinstance(letter, DeadLetter) and letter.error_type == "tenant_mismatch"
    assert letter.source_topic == Feedback.topic and letter.request_id == "r1"
    assert "'beta'" in letter.reason and "'acme'" in letter.reason
    kept = decode(letter.payload, window=None)  # nothing lost: the refused feedback travels with the reason
    assert isinstance(kept, Feedback) and kept.event_id == foreign.event_id and kept.tenant == "beta"
    assert audit_first.refused_other_tenant == feedback_first.refused_other_tenant == 1
    assert audit_first.state["r1"].joined_feedback == []  # a refused correction is not joined


def test_the_owner_still_corrects_after_a_refused_correction_and_a_redelivery_repeats_the_letter() -> None:
    joiner = BadCaseJoiner()
    joiner.process(audit("r2", response=RESPONSE, tenant="acme"))
    foreign = feedback("r2", corrected=CORRECTION, tenant="beta")
    (first,) = joiner.process(foreign)
    (again,) = joiner.process(foreign)  # at-least-once: the sinks absorb the same event id
    assert isinstance(first, DeadLetter) and encode(first) == encode(again)
    (case,) = joiner.process(feedback("r2", corrected=CORRECTION, tenant="acme"))
    assert isinstance(case, BadCase) and case.request_id == "r2"


def test_an_empty_tenant_on_either_side_names_no_owner_and_joins() -> None:
    for served_to, sent_by in (("acme", ""), ("", "beta"), ("", "")):
        joiner = BadCaseJoiner()
        joiner.process(audit("r3", response=RESPONSE, tenant=served_to))
        (case,) = joiner.process(feedback("r3", corrected=CORRECTION, tenant=sent_by))
        assert isinstance(case, BadCase), (served_to, sent_by)


def test_through_the_gateway_another_tenants_correction_never_becomes_a_bad_case() -> None:
    published: list = []

    def engine(request: httpx.Request) -> httpx.Response:
        message = {"role": "assistant", "content": RESPONSE}
        return httpx.Response(200, json={"choices": [{"index": 0, "message": message}],
                                         "usage": {"prompt_tokens": 1, "completion_tokens": 9}})

    keys = ApiKeys.parse_text(f"acme:{ACME_KEY},beta:{BETA_KEY}", "test")
    config = GatewayConfig(upstream="http://engine", engine="vllm", node_id="gw-t", api_keys=keys)  # type: ignore[arg-type]
    app = create_app(config, published.append, PiiRedactor(b"tenant-test-key"), transport=httpx.MockTransport(engine))
    chat = {"model": "base-m", "messages": [{"role": "user", "content": "我的余额是多少？"}], "max_tokens": 16}
    with TestClient(app) as client:
        answer = client.post("/v1/chat/completions", json=chat, headers={"Authorization": f"Bearer {ACME_KEY}"})
        assert answer.status_code == 200
        request_id = answer.headers["x-request-id"]
        for key in (BETA_KEY, ACME_KEY):
            body = {"request_id": request_id, "rating": -1, "correction": CORRECTION}
            posted = client.post("/v1/feedback", json=body, headers={"Authorization": f"Bearer {key}"})
            assert posted.status_code == 202, posted.text
    records = [decode(encode(r)) for r in published]  # as the worker reads them from Kafka
    audits = [r for r in records if isinstance(r, Audit)]
    beta, acme = [r for r in records if isinstance(r, Feedback)]
    assert [a.tenant for a in audits] == ["acme"] and (beta.tenant, acme.tenant) == ("beta", "acme")
    joiner = BadCaseJoiner()
    out = [o for r in records for o in joiner.process(r)]
    assert _kinds(out) == [DeadLetter, BadCase]
    letter, case = out
    assert letter.error_type == "tenant_mismatch" and decode(letter.payload).event_id == beta.event_id
    assert case.event_id != letter.event_id and case.correction == CORRECTION and case.audit_id == audits[0].audit_id
