"""The feedback API (issue 13, item 1): ``X-Request-Id`` on every completion response, and
``POST /v1/feedback`` — keys, validation, redaction, idempotency, rate limit — plus the Python client,
driven against the real gateway app served by uvicorn where it matters."""

from __future__ import annotations

import httpx
import pytest
from entroloop.collectors.feedback_client import FeedbackClient, FeedbackError
from entroloop.collectors.gateway.app import GatewayConfig, create_app
from entroloop.collectors.gateway.auth import ApiKeys
from entroloop.collectors.gateway.feedback import TokenBuckets, feedback_event_id
from starlette.testclient import TestClient

from entroloop.contract import codec
from entroloop.contract.ids import uuid7
from entroloop.contract.records import Feedback
from entroloop.contract.settings import Settings
from entroloop.infra.pii import PiiRedactor
from tests.unit.collectors.fake_openai_upstream import FakeUpstream
from tests.unit.collectors.served_app import ServedApp

ACME_KEY = "acme-0123456789abcdef-key"
BETA_KEY = "beta-0123456789abcdef-key"
KEYS = ApiKeys.parse_text(f"acme:{ACME_KEY},beta:{BETA_KEY}", "test")
ACME = {"Authorization": f"Bearer {ACME_KEY}"}
CHAT = {"model": "base-m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
REDACTOR_KEY = b"feedback-test-key"


def _config(upstream: str = "http://engine", **extra: object) -> GatewayConfig:
    return GatewayConfig(upstream=upstream, engine="vllm", node_id="gw-f", api_keys=KEYS, **extra)  # type: ignore[arg-type]


def _engine(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/v1/chat/completions":
        return httpx.Response(200, json={"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
                                         "usage": {"prompt_tokens": 1, "completion_tokens": 1}},
                              headers={"X-Request-Id": "engine-own-id"})
    return httpx.Response(200, json={"ok": True})


def _client(published: list, **extra: object) -> TestClient:
    return TestClient(create_app(_config(**extra), published.append, PiiRedactor(REDACTOR_KEY),
                                 transport=httpx.MockTransport(_engine)))


def _feedbacks(published: list) -> list[Feedback]:
    return [r for r in published if isinstance(r, Feedback)]


# --- X-Request-Id on every completion response ---------------------------------------------------
def test_every_completion_response_carries_the_request_id_its_records_use() -> None:
    published: list = []
    with FakeUpstream(vllm=True) as upstream:
        upstream.missing.add("gone-model")
        app = create_app(_config(upstream.url), published.append, PiiRedactor(REDACTOR_KEY))
        with ServedApp(app, "gateway") as gw, httpx.Client(base_url=gw.url, headers=ACME, timeout=10) as http:
            plain = http.post("/v1/chat/completions", json=CHAT)
            text = http.post("/v1/completions", json={"model": "base-m", "prompt": "hi", "max_tokens": 2})
            with http.stream("POST", "/v1/chat/completions", json={**CHAT, "stream": True}) as streamed:
                streamed.read()
            mine = http.post("/v1/chat/completions", json=CHAT, headers={"X-Request-Id": "client-chosen-1"})
            engine_error = http.post("/v1/chat/completions", json={**CHAT, "model": "gone-model"})
            gateway_error = http.post("/v1/chat/completions", content=b"{not json")
    for answer in (plain, text, streamed, mine):
        assert answer.status_code == 200
    assert engine_error.status_code == 404 and gateway_error.status_code == 400
    ids = [a.headers.get("x-request-id") for a in (plain, text, streamed, mine, engine_error, gateway_error)]
    assert all(ids), ids
    assert ids[3] == "client-chosen-1"
    assert len(set(ids)) == len(ids)
    audited = {r.request_id for r in published}
    assert set(ids[:5]) <= audited  # the id in the header is the id of the records
    # the engine saw the same id, so vLLM's own records carry it too
    assert [h["x-request-id"] for _, _, h in upstream.received] == ids[:5]


def test_the_gateway_request_id_replaces_one_the_engine_sent_and_an_unreachable_engine_still_gets_one() -> None:
    with _client([]) as client:
        answer = client.post("/v1/chat/completions", json=CHAT, headers=ACME)
    assert answer.status_code == 200
    assert answer.headers.get_list("x-request-id") != ["engine-own-id"]
    assert len(answer.headers.get_list("x-request-id")) == 1
    with TestClient(create_app(_config("http://127.0.0.1:9"), [].append, PiiRedactor(REDACTOR_KEY))) as client:
        down = client.post("/v1/chat/completions", json=CHAT, headers={**ACME, "X-Request-Id": "r-down"})
    assert down.status_code == 502 and down.headers["x-request-id"] == "r-down"


def test_the_gateway_refusals_of_a_completion_carry_a_request_id_too() -> None:
    with _client([], max_body_bytes=2048) as client:
        no_key = client.post("/v1/chat/completions", json=CHAT)
        bad_key = client.post("/v1/chat/completions", json=CHAT, headers={"X-API-Key": "x" * 20, "X-Request-Id": "r-403"})
        too_big = client.post("/v1/completions", content=b"x" * 4096, headers=ACME)
        models = client.get("/v1/models", headers=ACME)
    assert (no_key.status_code, bad_key.status_code, too_big.status_code) == (401, 403, 413)
    assert len(no_key.headers["x-request-id"]) == 36 and bad_key.headers["x-request-id"] == "r-403"
    assert len(too_big.headers["x-request-id"]) == 36
    assert "x-request-id" not in models.headers  # only the completion paths are given one


# --- POST /v1/feedback -----------------------------------------------------------------------------
def test_feedback_is_accepted_and_published_redacted_and_pseudonymised() -> None:
    published: list = []
    body = {"request_id": "req-1", "rating": -4, "correction": "Write to alice.smith@example.com instead.",
            "comment": "my mail is bob@example.org", "error_type": "fact", "user_id": "user-42"}
    with _client(published) as client:
        answer = client.post("/v1/feedback", json=body, headers=ACME)
    assert answer.status_code == 202, answer.text
    reply = answer.json()
    assert set(reply) == {"feedback_id", "event_id", "request_id"} and reply["request_id"] == "req-1"
    [record] = _feedbacks(published)
    assert record.event_id == reply["event_id"] and record.request_id == "req-1"
    assert record.rating == -4 and record.error_type == "fact"
    assert "alice.smith@example.com" not in record.corrected_answer and "[EMAIL:" in record.corrected_answer
    assert record.corrected_answer.startswith("Write to ") and record.corrected_answer.endswith(" instead.")
    assert "bob@example.org" not in record.comment and "[EMAIL:" in record.comment
    assert record.user_id == PiiRedactor(REDACTOR_KEY).pseudonymise_user("user-42") != "user-42"
    assert codec.decode(codec.encode(record)) == record  # a valid record of the contract
    assert not any(b"@example" in codec.encode(r) for r in published)


def test_feedback_needs_a_valid_key() -> None:
    published: list = []
    body = {"request_id": "req-1", "rating": 1}
    with _client(published) as client:
        missing = client.post("/v1/feedback", json=body)
        wrong = client.post("/v1/feedback", json=body, headers={"Authorization": "Bearer not-a-valid-key-at-all"})
    assert missing.status_code == 401 and wrong.status_code == 403
    assert _feedbacks(published) == []


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"request_id": "r", "rating": 11}, "rating"),
        ({"request_id": "r", "rating": -11}, "rating"),
        ({"request_id": "r", "rating": "5"}, "rating"),
        ({"request_id": "r", "rating": 2.5}, "rating"),
        ({"request_id": "r", "rating": True}, "rating"),
        ({"rating": 3}, "request_id"),
        ({"request_id": "", "rating": 3}, "request_id"),
        ({"request_id": 7, "rating": 3}, "request_id"),
        ({"request_id": "r", "rating": 3, "correction": ["a"]}, "correction"),
        ({"request_id": "r", "rating": 3, "user_id": 42}, "user_id"),
        ({"request_id": "r", "rating": 3, "stars": 5}, "stars"),
    ],
)
def test_invalid_feedback_gets_400_naming_the_field(body: dict, field: str) -> None:
    published: list = []
    with _client(published) as client:
        answer = client.post("/v1/feedback", json=body, headers=ACME)
    assert answer.status_code == 400, answer.text
    message = answer.json()["error"]["message"]
    assert message.startswith("invalid feedback:") and field in message
    assert _feedbacks(published) == []


def test_a_body_that_is_not_json_gets_400() -> None:
    with _client([]) as client:
        answer = client.post("/v1/feedback", content=b"rating=3", headers=ACME)
    assert answer.status_code == 400 and "JSON object" in answer.json()["error"]["message"]


def test_a_retried_feedback_publishes_the_same_event_id_and_tenants_do_not_collide() -> None:
    published: list = []
    body = {"request_id": "req-9", "rating": 5, "feedback_id": "client-fb-1"}
    with _client(published) as client:
        first = client.post("/v1/feedback", json=body, headers=ACME).json()
        retry = client.post("/v1/feedback", json=body, headers=ACME).json()
        other = client.post("/v1/feedback", json=body, headers={"X-API-Key": BETA_KEY}).json()
        fresh = client.post("/v1/feedback", json={"request_id": "req-9", "rating": 5}, headers=ACME).json()
    assert first == retry and first["feedback_id"] == "client-fb-1"
    assert other["event_id"] != first["event_id"]
    assert [r.event_id for r in _feedbacks(published)][:2] == [first["event_id"]] * 2
    # without a feedback id one is made (a UUIDv7) and returned; sent again, it gives the same event
    assert fresh["feedback_id"] != "client-fb-1" and len(fresh["feedback_id"]) == 36
    assert feedback_event_id("acme", fresh["feedback_id"]) == fresh["event_id"]
    # deterministic across processes: a pure function of (tenant, feedback id)
    assert feedback_event_id("acme", "client-fb-1") == first["event_id"]
    fb = uuid7(1_700_000_000.0)
    assert feedback_event_id("acme", fb)[:13] == fb[:13]  # time-ordered like the feedback id


def test_feedback_over_the_rate_gets_429_with_retry_after_per_tenant_and_user() -> None:
    published: list = []
    body = {"request_id": "r", "rating": 1, "user_id": "u1"}
    with _client(published, feedback_rate_per_min=3.0) as client:
        answers = [client.post("/v1/feedback", json=body, headers=ACME) for _ in range(4)]
        other_user = client.post("/v1/feedback", json={**body, "user_id": "u2"}, headers=ACME)
        other_tenant = client.post("/v1/feedback", json=body, headers={"X-API-Key": BETA_KEY})
    assert [a.status_code for a in answers] == [202, 202, 202, 429]
    assert int(answers[3].headers["retry-after"]) >= 1
    assert other_user.status_code == 202 and other_tenant.status_code == 202
    assert len(_feedbacks(published)) == 5


def test_a_tenant_varying_user_id_is_limited_by_its_tenant_bucket() -> None:
    published: list = []
    with _client(published, feedback_rate_per_min=3.0, feedback_tenant_rate_per_min=5.0) as client:
        answers = [client.post("/v1/feedback", json={"request_id": "r", "rating": 1, "user_id": f"u{i}"}, headers=ACME)
                   for i in range(7)]
        other_tenant = client.post("/v1/feedback", json={"request_id": "r", "rating": 1, "user_id": "u1"},
                                   headers={"X-API-Key": BETA_KEY})
    assert [a.status_code for a in answers] == [202] * 5 + [429, 429]
    assert "tenant" in answers[5].json()["error"]["message"] and int(answers[5].headers["retry-after"]) >= 1
    assert other_tenant.status_code == 202  # one tenant's budget is its own
    assert len(_feedbacks(published)) == 6


def test_a_users_refused_posts_do_not_use_up_the_tenants_budget() -> None:
    published: list = []
    body = {"request_id": "r", "rating": 1, "user_id": "flooder"}
    with _client(published, feedback_rate_per_min=2.0, feedback_tenant_rate_per_min=4.0) as client:
        flood = [client.post("/v1/feedback", json=body, headers=ACME).status_code for _ in range(10)]
        others = [client.post("/v1/feedback", json={**body, "user_id": f"u{i}"}, headers=ACME).status_code
                  for i in range(2)]
    assert flood == [202, 202] + [429] * 8
    assert others == [202, 202]


def test_the_tenant_rate_comes_from_the_settings() -> None:
    config = GatewayConfig.from_settings(Settings(gateway_feedback_tenant_rate_per_min=120.0))
    assert config.feedback_tenant_rate_per_min == 120.0


def test_token_buckets_refill_at_the_rate() -> None:
    now = [0.0]
    buckets = TokenBuckets(60.0, clock=lambda: now[0])  # one per second, 60 at most
    assert all(buckets.take(("t", "u")) == 0 for _ in range(60))
    assert buckets.take(("t", "u")) == pytest.approx(1.0)
    now[0] = 2.0
    assert buckets.take(("t", "u")) == 0 and buckets.take(("t", "u")) == 0
    assert buckets.take(("t", "u")) > 0


# --- the Python client against the served gateway ---------------------------------------------------
def test_the_client_round_trip_against_the_served_gateway() -> None:
    published: list = []
    with FakeUpstream(vllm=True) as upstream:
        app = create_app(_config(upstream.url, feedback_rate_per_min=2.0), published.append, PiiRedactor(REDACTOR_KEY))
        with ServedApp(app, "gateway") as gw:
            completion = httpx.post(f"{gw.url}/v1/chat/completions", json=CHAT, headers=ACME, timeout=10)
            request_id = completion.headers["x-request-id"]
            with FeedbackClient(gw.url, ACME_KEY) as client:
                receipt = client.send(request_id, -6, "call 13800138000 please", error_type="fact", user_id="u-7")
                again = client.send(request_id, -6, "call 13800138000 please", error_type="fact", user_id="u-7",
                                    feedback_id=receipt.feedback_id)
                with pytest.raises(FeedbackError) as limited:
                    client.send(request_id, -6, user_id="u-7")
                with pytest.raises(FeedbackError) as invalid:
                    client.send(request_id, 42)
            with FeedbackClient(gw.url, "wrong-key-0123456789") as stranger, pytest.raises(FeedbackError) as refused:
                stranger.send(request_id, 1)
    assert receipt.request_id == request_id and again.event_id == receipt.event_id
    assert limited.value.status == 429 and limited.value.retry_after is not None
    assert invalid.value.status == 400 and "rating" in str(invalid.value)
    assert refused.value.status == 403
    feedbacks = _feedbacks(published)
    assert [f.event_id for f in feedbacks] == [receipt.event_id] * 2
    assert feedbacks[0].request_id == request_id and "13800138000" not in feedbacks[0].corrected_answer


def test_a_publisher_failure_gets_503_and_the_retry_keeps_the_event_id() -> None:
    published: list = []
    failures = [RuntimeError("queue full")]

    def publish(record: object) -> None:
        if failures:
            raise failures.pop()
        published.append(record)

    body = {"request_id": "r", "rating": 0, "feedback_id": "fb-503"}
    with TestClient(create_app(_config(), publish, PiiRedactor(REDACTOR_KEY),
                               transport=httpx.MockTransport(_engine))) as client:
        failed = client.post("/v1/feedback", json=body, headers=ACME)
        retried = client.post("/v1/feedback", json=body, headers=ACME)
    assert failed.status_code == 503 and "feedback_id" in failed.json()["error"]["message"]
    assert retried.status_code == 202
    assert [r.event_id for r in _feedbacks(published)] == [feedback_event_id("acme", "fb-503")]
