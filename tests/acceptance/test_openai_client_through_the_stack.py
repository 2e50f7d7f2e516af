"""Acceptance: a client nobody here wrote (the official ``openai`` SDK) drives the real stack.

Chat completions (plain and streamed) go through ``entroloop gateway`` to the vLLM CPU engine;
feedback with a correction goes through the gateway's feedback API; the records travel Kafka ->
``entroloop worker`` -> ``entroloop sink clickhouse`` / ``sink audit``; an answer that breaks a
compliance rule raises an alert whose runbook (the packaged ``pause-route-on-compliance``), run by
``entroloop actions``, pauses the gateway's route, so the client's next call is refused. The test
then reads everything back the way an operator would: audit records by id (``entroloop audit
get``), spans by the client's trace id, the bad case, the alert and the action (``entroloop
query``), and the same ids in ``entroloop report``'s HTML.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from typing import TYPE_CHECKING

import httpx
import pytest

from entroloop.contract import codec
from entroloop.contract.records import Alert, BadCase, TokenEntropy
from tests.acceptance.conftest import MODEL, ROUTE, Stack
from tests.acceptance.processes import Child, light_python, query, run_cli

if TYPE_CHECKING:
    import openai

pytestmark = pytest.mark.acceptance

TRACE_ID = secrets.token_hex(16)
CLIENT_SPAN = secrets.token_hex(8)
CORRECTION = "Your order ships within two business days."
RUNBOOK = "pause-route-on-compliance"


def _openai(stack: Stack) -> openai.OpenAI:
    # imported here, not at the top: the light suite collects this folder too (and deselects it)
    import openai

    # max_retries=0: a refused call must show as refused, not be retried into a pass
    return openai.OpenAI(base_url=f"{stack.gateway_url}/v1", api_key=stack.client_key, max_retries=0, timeout=120,
                         default_headers={"traceparent": f"00-{TRACE_ID}-{CLIENT_SPAN}-01"})


def _chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def _words(stack: Stack) -> dict[str, list[int]]:
    """vLLM's ``allowed_token_ids``: the tiny random model answers in whole words (see conftest)."""
    return {"allowed_token_ids": stack.word_token_ids}


def test_a_plain_http_client_gets_413_for_a_10_mb_body_and_401_403_for_feedback_without_a_valid_key(stack: Stack) -> None:
    body = json.dumps({"model": MODEL, "messages": _chat("z" * (10 << 20))}).encode()
    with httpx.Client(base_url=stack.gateway_url, timeout=60) as http:
        big = http.post("/v1/chat/completions", content=body,
                        headers={"Authorization": f"Bearer {stack.client_key}", "Content-Type": "application/json"})
        feedback = {"request_id": "any", "rating": -5}
        no_key = http.post("/v1/feedback", json=feedback)
        wrong_key = http.post("/v1/feedback", json=feedback, headers={"Authorization": f"Bearer {'x' * 32}"})
    assert big.status_code == 413, big.text
    assert "ENTROLOOP_GATEWAY_MAX_BODY_BYTES" in big.json()["error"]["message"]
    assert (no_key.status_code, wrong_key.status_code) == (401, 403), (no_key.text, wrong_key.text)


def _wait_for_records(stack: Stack, wanted: dict[str, object], timeout_s: float) -> None:
    """Read the stack's topics from the start until every ``wanted`` predicate matched a record."""
    from confluent_kafka import Consumer

    topics = {Alert.topic, BadCase.topic, TokenEntropy.topic}
    prefix = stack.env["ENTROLOOP_TOPIC_PREFIX"]
    consumer = Consumer({"bootstrap.servers": stack.env["ENTROLOOP_KAFKA_BOOTSTRAP"], "enable.auto.commit": False,
                         "group.id": f"acceptance-probe-{secrets.token_hex(4)}", "auto.offset.reset": "earliest"})
    consumer.subscribe([prefix + t for t in topics])
    missing = dict(wanted)
    deadline = time.monotonic() + timeout_s
    try:
        while missing and time.monotonic() < deadline:
            for message in consumer.consume(500, timeout=0.5):
                if message.error() is None:
                    record = codec.decode(message.value())
                    for name, matches in list(missing.items()):
                        if matches(record):  # type: ignore[operator]
                            del missing[name]
    finally:
        consumer.close()
    worker = next(c for c in stack.children if c.name == "worker")
    assert not missing, f"never on Kafka: {sorted(missing)}; worker log:\n{worker.log_tail()}"


def _run_sinks(stack: Stack, round_: int) -> None:
    sinks = [Child(f"sink-{kind}-{round_}", [light_python(), "-m", "entroloop.cli", "sink", kind, "--until-empty"],
                   stack.env, stack.logs) for kind in ("clickhouse", "audit")]
    try:
        for sink in sinks:
            assert sink.finish(240) == 0, f"{sink.name} failed:\n{sink.log_tail()}"
    finally:
        for sink in sinks:
            sink.stop()


def test_the_openai_sdk_through_gateway_vllm_kafka_workers_sinks_actions_and_report(stack: Stack) -> None:
    client = _openai(stack)

    # 1. a plain and a streamed chat completion; every answer carries the X-Request-Id to cite
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=_chat("where is my order"), max_tokens=8, temperature=0.0, user="alice",
        extra_body=_words(stack))
    plain, plain_id = raw.parse(), raw.headers["x-request-id"]
    plain_text = plain.choices[0].message.content
    assert plain_text and plain.usage.completion_tokens == 8, plain
    with client.chat.completions.with_streaming_response.create(
            model=MODEL, messages=_chat("one two three"), max_tokens=6, temperature=0.0, stream=True,
            extra_body=_words(stack)) as response:
        streamed_id = response.headers["x-request-id"]
        streamed_text = "".join(c.choices[0].delta.content or "" for c in response.parse() if c.choices)
    assert streamed_text and streamed_id != plain_id

    # 2. the user corrects the plain answer through the feedback API
    with httpx.Client(base_url=stack.gateway_url, timeout=30,
                      headers={"Authorization": f"Bearer {stack.client_key}"}) as http:
        accepted = http.post("/v1/feedback", json={"request_id": plain_id, "rating": -8, "correction": CORRECTION,
                                                   "error_type": "wrong_answer", "user_id": "alice"})
    assert accepted.status_code == 202, accepted.text
    assert accepted.json()["feedback_id"]

    # 3. an answer that breaks the compliance rule (a run of one token, forced by logit_bias)
    raw = client.chat.completions.with_raw_response.create(
        model=MODEL, messages=_chat("tell me a secret"), max_tokens=12, temperature=0.0,
        logit_bias={str(stack.forced_token_id): 100}, extra_body=_words(stack))
    breaking_id, breaking_text = raw.headers["x-request-id"], raw.parse().choices[0].message.content
    assert breaking_text.split() == stack.forced_text.split(), breaking_text

    # 4. the worker derives the bad case and the alert; the engine's tap published every request's entropy
    answered = (plain_id, streamed_id, breaking_id)
    _wait_for_records(stack, {
        "bad case of the corrected answer": lambda r: isinstance(r, BadCase) and r.request_id == plain_id,
        "compliance alert": lambda r: isinstance(r, Alert) and r.rule == "response_compliance" and r.request_id == breaking_id,
        **{f"token entropy of {rid}": (lambda r, rid=rid: isinstance(r, TokenEntropy) and r.request_id == rid)
           for rid in answered},
    }, timeout_s=180)

    # 5. the sinks store it; the action runner runs the alert's runbook against the gateway's admin API
    _run_sinks(stack, 1)
    admin = {"Authorization": f"Bearer {stack.admin_key}"}
    before = httpx.get(f"{stack.gateway_url}/admin/state", headers=admin, timeout=10)
    assert before.status_code == 200 and ROUTE not in before.json()["routes"], before.text  # the runbook is what pauses it
    actions_env = {**stack.env, "ENTROLOOP_ACTIONS_DRY_RUN": "false", "ENTROLOOP_ACTIONS_GATEWAY_URL": stack.gateway_url,
                   "ENTROLOOP_ACTIONS_WEBHOOK_TOKEN": stack.admin_key}
    run_cli("actions", ["actions", "--until-idle", "--json"], actions_env, stack.logs)

    # 6. the gateway now handles the route differently: its admin state says paused, the client is refused
    state = httpx.get(f"{stack.gateway_url}/admin/state", headers=admin, timeout=10)
    assert state.status_code == 200, state.text
    pause = state.json()["routes"].get(ROUTE)
    assert pause is not None, state.json()
    assert pause["left_s"] > 0 and pause["alert_key"], pause
    from openai import APIStatusError

    with pytest.raises(APIStatusError) as refused:
        client.chat.completions.create(model=MODEL, messages=_chat("where is my order"), max_tokens=4)
    assert refused.value.status_code == 503
    assert refused.value.response.json()["error"]["code"] == "route_paused"
    assert int(refused.value.response.headers["retry-after"]) > 0

    # 7. a second sink pass stores the Action records; then everything is read back by id
    _run_sinks(stack, 2)
    in_ids = ", ".join(f"'{rid}'" for rid in answered)
    audits = {row["request_id"]: row for row in query(
        f"SELECT request_id, audit_id, trace_id, route, tenant FROM entroloop.audit_index FINAL WHERE request_id IN ({in_ids})",
        stack.env, stack.logs)}
    assert set(audits) == set(answered)
    for rid, text in ((plain_id, plain_text), (streamed_id, streamed_text), (breaking_id, breaking_text)):
        assert (audits[rid]["trace_id"], audits[rid]["route"], audits[rid]["tenant"]) == (TRACE_ID, ROUTE, "acme")
        lines = run_cli(f"audit-get-{rid}", ["audit", "get", "--audit-id", audits[rid]["audit_id"]], stack.env, stack.logs)
        (record,) = [json.loads(line) for line in lines.splitlines() if line.startswith("{")]
        assert record["request_id"] == rid and record["response"] == text, record

    spans = query(f"SELECT request_id, name, parent_span_id FROM entroloop.spans FINAL WHERE trace_id = '{TRACE_ID}'",
                  stack.env, stack.logs)
    for rid in answered:
        names = {s["name"] for s in spans if s["request_id"] == rid}
        assert len(names) >= 2 and "llm_request" in names, (rid, spans)  # the gateway's span and vLLM's
        assert any(s["parent_span_id"] == CLIENT_SPAN for s in spans if s["request_id"] == rid), spans

    (bad_case,) = query(f"SELECT request_id, response, correction FROM entroloop.bad_cases FINAL WHERE request_id = '{plain_id}'",
                        stack.env, stack.logs)
    assert (bad_case["response"], bad_case["correction"]) == (plain_text, CORRECTION)
    (alert,) = query("SELECT alert_key, route FROM entroloop.alerts FINAL WHERE rule = 'response_compliance'",
                     stack.env, stack.logs)
    assert alert["alert_key"] == pause["alert_key"] and alert["route"] == ROUTE
    actions = query(f"SELECT action, outcome, dry_run FROM entroloop.actions FINAL WHERE runbook = '{RUNBOOK}'",
                    stack.env, stack.logs)
    assert {"action": "pause_route", "outcome": "ok", "dry_run": 0} in [
        {**a, "dry_run": int(a["dry_run"])} for a in actions], actions

    # 8. the operator's report shows the requests, the bad case and the alert's action
    report = stack.work / "report.html"
    run_cli("report", ["report", "--out", str(report)], stack.env, stack.logs)
    text = re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", report.read_text()))  # what a reader sees, not the markup
    for rid in answered:
        assert rid in text, f"request {rid} is not in the report"
    assert RUNBOOK in text and "pause_route" in text, "the alert's action is not in the report"
    # the bad case and the alert: shown in full (the correction, the rule) or at least counted
    assert CORRECTION in text or re.search(r"\bbad_cases 1\b", text), "the bad case is not in the report"
    assert "response_compliance" in text or re.search(r"\balerts 1\b", text), "the alert is not in the report"
