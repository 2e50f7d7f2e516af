"""The gateway's ``GET /metrics`` (issue 13 item 4): entroloop's counters and the engine's own
metrics in one scrape, scraped from outside with a plain HTTP client, without a key."""

from __future__ import annotations

import httpx
from entroloop.collectors.gateway.app import GatewayConfig, create_app
from entroloop.collectors.gateway.auth import ApiKeys
from entroloop.collectors.gateway.metrics import route_template
from prometheus_client.parser import text_string_to_metric_families
from starlette.testclient import TestClient

from entroloop.infra.pii import PiiRedactor

KEY = "acme-0123456789abcdef-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 2}
VLLM_METRICS = "# HELP vllm:num_requests_running Running.\n# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 3.0\n"


def _engine(up: bool):
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/metrics":
            return httpx.Response(200, text=VLLM_METRICS) if up else httpx.Response(503)
        return httpx.Response(200, json={"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}],
                                         "usage": {"prompt_tokens": 1, "completion_tokens": 1}})
    return answer


def _samples(text: str) -> dict[tuple[str, tuple], float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def _client(published: list, up: bool = True) -> TestClient:
    config = GatewayConfig(upstream="http://engine", engine="vllm", node_id="gw-m",
                           api_keys=ApiKeys.parse_text(f"acme:{KEY}", "test"))
    return TestClient(create_app(config, published.append, PiiRedactor(b"k"), transport=httpx.MockTransport(_engine(up))))


def _value(samples, name, **labels) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def test_metrics_count_requests_and_published_records_and_append_the_engines_own():
    published: list = []
    with _client(published) as client:
        before = _samples(client.get("/metrics").text)
        assert client.post("/v1/chat/completions", json=CHAT, headers=AUTH).status_code == 200
        assert client.post("/v1/chat/completions", json=CHAT).status_code == 401  # no key
        scrape = client.get("/metrics")
    assert scrape.status_code == 200 and scrape.headers["content-type"].startswith("text/plain")
    after = _samples(scrape.text)
    path = "/v1/chat/completions"
    assert _value(after, "entroloop_http_requests_total", path=path, status="200") - \
        _value(before, "entroloop_http_requests_total", path=path, status="200") == 1
    assert _value(after, "entroloop_http_requests_total", path=path, status="401") - \
        _value(before, "entroloop_http_requests_total", path=path, status="401") == 1
    topics = {type(r).topic for r in published}
    for topic in topics:
        assert _value(after, "entroloop_events_out_total", component="gateway", topic=topic) > \
            _value(before, "entroloop_events_out_total", component="gateway", topic=topic)
    assert after[("vllm:num_requests_running", ())] == 3.0
    assert after[("entroloop_upstream_metrics_up", ())] == 1.0


def test_an_engine_without_metrics_only_loses_its_part():
    with _client([], up=False) as client:
        scrape = client.get("/metrics")
    assert scrape.status_code == 200
    samples = _samples(scrape.text)
    assert samples[("entroloop_upstream_metrics_up", ())] == 0.0
    assert not any(name.startswith("vllm:") for name, _ in samples)


def test_path_labels_stay_bounded():
    known = frozenset({"/v1/chat/completions"})
    assert route_template("/v1/chat/completions", known) == "/v1/chat/completions"
    assert route_template("/admin/adapters/lora-secret-name/unload", known) == "/admin"
    assert route_template("/v1/models/anything", known) == "other"
