"""The entropy tap's records reach the real Kafka broker through the node's publisher.

The default sink (``ENTROLOOP_ENTROPY_TAP_SINK=publisher``) inside vLLM's engine-core process,
configured only by ``ENTROLOOP_`` variables, exactly as on a serving node.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from entroloop.contract.records import TokenEntropy
from entroloop.infra.kafka_topics import ensure_topics
from tests.integration.test_publisher_kafka import consume_all

pytestmark = [pytest.mark.vllm, pytest.mark.kafka]

MAX_TOKENS = [5, 11, 2, 8]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.integration.vllm_tiny_model import build_tiny_llama

    return build_tiny_llama(tmp_path_factory.mktemp("tiny-llama-kafka"))


def test_token_entropy_records_reach_kafka(
    tiny_model: Path, kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from vllm import LLM, SamplingParams

    ensure_topics(kafka_bootstrap, prefix=topic_prefix)
    for name, value in {
        "ENTROLOOP_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "ENTROLOOP_TOPIC_PREFIX": topic_prefix,
        "ENTROLOOP_ENTROPY_TAP_SINK": "publisher",
        "ENTROLOOP_ENTROPY_TAP_ENABLED": "true",
        "ENTROLOOP_NODE_ID": "vllm-kafka-node",
        "ENTROLOOP_PUBLISHER_SPOOL_DIR": str(tmp_path / "spool"),
        "VLLM_USE_V2_MODEL_RUNNER": "0",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "HF_HUB_OFFLINE": "1",
    }.items():
        monkeypatch.setenv(name, value)

    llm = LLM(model=str(tiny_model), dtype="float32", enforce_eager=True, max_model_len=128, max_num_seqs=2, seed=0)
    params = [
        SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True,
                       extra_args={"entroloop_request_id": f"kreq-{i}"})
        for i, n in enumerate(MAX_TOKENS)
    ]
    outputs = llm.generate(["alpha beta", "the model", "kafka stream audit", "one two"], params, use_tqdm=False)
    records = consume_all(kafka_bootstrap, [topic_prefix + TokenEntropy.topic], expected=len(MAX_TOKENS))
    del llm

    by_id = {r.request_id: r for r in records if isinstance(r, TokenEntropy)}
    assert sorted(by_id) == [f"kreq-{i}" for i in range(len(MAX_TOKENS))]
    assert len(records) == len(MAX_TOKENS)  # no duplicates on the happy path
    for i, output in enumerate(outputs):
        record = by_id[f"kreq-{i}"]
        assert record.n_tokens == len(output.outputs[0].token_ids) == MAX_TOKENS[i]
        assert record.node_id == "vllm-kafka-node" and record.final
        # the per-token hashes (the sampled ids) survive the publisher and the broker
        assert record.hashes().tolist() == list(output.outputs[0].token_ids)
    assert len({r.seq for r in records}) == len(records)
