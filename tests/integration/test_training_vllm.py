"""The closed loop against the real vLLM engine (CPU build) serving the tiny base model.

A registered adapter is loaded into a running ``vllm`` OpenAI server at run time (runtime LoRA
API), requests naming it are served by it (it answers the corrections it learned, the base model
does not), and a canary rollout whose live error rate is pushed over the limit is rolled back
automatically: the adapter is unloaded from the server and every step is an Action record,
written to ClickHouse like any other event.

The "gateway" here is the test: it routes live requests through ``CanaryRouter``, sends them to
vLLM and writes one request span per call to ClickHouse; after the first canary stage it marks a
share of the canary's answers as errors (the fault injected), which is what the canary must catch.
"""

from __future__ import annotations

import json
import random
import threading
import time
from pathlib import Path

import pytest
from entroloop.training.actions import ActionLog
from entroloop.training.jobs import JobRunner, JobStore
from entroloop.training.pipeline import MemorySource, TrainingPipeline
from entroloop.training.publisher import (
    AdapterPublisher,
    CanaryPolicy,
    CanaryRouter,
    ClickHouseCanaryMetrics,
    VllmError,
    VllmLoraClient,
)
from entroloop.training.registry import AdapterRegistry

from entroloop.contract.ids import NodeStamper, new_span_id
from entroloop.contract.records import Action, Span
from entroloop.infra.worm.worm_store import LocalWormStore
from tests.integration import lora_vllm_server
from tests.integration.training_fixtures import (
    GATE_OVERRIDES,
    MODEL,
    TOPIC_ANSWERS,
    TRAIN_OVERRIDES,
    correction_records,
    replay_pairs,  # noqa: F401 - fixture
    retrain_request,
    tiny_base_model,  # noqa: F401 - fixture
    training_settings,
)

pytestmark = [pytest.mark.vllm, pytest.mark.training]

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def vllm_process(tiny_base_model, tmp_path_factory):
    """Start the ``vllm`` OpenAI server (CPU) for the tiny model with runtime LoRA updating enabled.

    Readiness is awaited by ``vllm_server``, after the adapter is trained: the server boots while
    the test trains.
    """
    log = tmp_path_factory.mktemp("vllm") / "server.log"
    proc, client = lora_vllm_server.start(tiny_base_model, MODEL, log, cwd=REPO)
    try:
        yield proc, client, log
    finally:
        lora_vllm_server.stop(proc)


@pytest.fixture(scope="module")
def vllm_server(vllm_process, trained):
    """The started server once it serves the base model."""
    proc, client, log = vllm_process
    lora_vllm_server.wait_until_serving(proc, client, MODEL, log, timeout_s=300)
    return client


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny_base_model, replay_pairs, chdb_client):
    """One accepted, registered adapter (the job of the training tests) and its registry."""
    tmp = tmp_path_factory.mktemp("loop")
    database = f"t_vllm_{random.randrange(16**8):08x}"
    actions = ActionLog()
    registry = AdapterRegistry(LocalWormStore(tmp / "adapters"), chdb_client, database, actions)
    registry.ensure_schema()
    pipeline = TrainingPipeline(training_settings(tmp, tiny_base_model), MemorySource(correction_records(replay_pairs)),
                                registry, train_overrides=TRAIN_OVERRIDES, gate_overrides=GATE_OVERRIDES,
                                progress=False)
    job = JobRunner(JobStore(tmp / "training"), pipeline.steps(), actions).submit(retrain_request("vllm-key"))
    assert job.state == "accepted", job.status()["results"].get("gate")
    adapter_id = job.status()["results"]["register"]["adapter_id"]
    served = registry.fetch(adapter_id, tmp / "served" / adapter_id)  # digests checked against the manifest
    return registry, adapter_id, served, actions, database


def _complete(client: VllmLoraClient, model: str, prompt: str, max_tokens: int = 3) -> str:
    return client.complete(model, prompt + "\n", max_tokens=max_tokens)["choices"][0]["text"]


def test_adapter_loaded_at_run_time_serves_the_corrections(vllm_server, trained):
    registry, adapter_id, served, actions, _ = trained
    vllm_server.load(adapter_id, str(served))
    try:
        assert adapter_id in vllm_server.models()
        hits_adapter = hits_base = 0
        for topic, answer in TOPIC_ANSWERS.items():
            prompt = f"{topic} canary tenant route"
            hits_adapter += _complete(vllm_server, adapter_id, prompt).strip().startswith(answer)
            hits_base += _complete(vllm_server, MODEL, prompt).strip().startswith(answer)
        print(f"adapter {hits_adapter}/6, base {hits_base}/6")
        assert hits_adapter >= 5 and hits_base == 0
    finally:
        vllm_server.unload(adapter_id)
    assert adapter_id not in vllm_server.models()


class Gateway:
    """Live traffic: route, call vLLM, write one request span per call to ClickHouse."""

    def __init__(self, client, router, sink, fault) -> None:
        self.client, self.router, self.sink, self.fault = client, router, sink, fault
        self.stamper = NodeStamper("gateway")
        self.stop = threading.Event()
        self.served: dict[str, int] = {}
        self.offset = 0
        self.rng = random.Random(5)
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self) -> None:
        i = 0
        while not self.stop.is_set():
            batch = []
            for _ in range(8):
                i += 1
                request_id = f"live-{i}"
                model = self.router.choose(request_id)
                start = time.time()
                try:
                    _complete(self.client, model, f"{random.choice(list(TOPIC_ANSWERS))} user {i}", 2)
                    status = "ok"
                except VllmError:
                    status = "error"  # e.g. the adapter was unloaded between routing and the call
                if status == "ok" and model != self.router.base_model and self.fault() and self.rng.random() < 0.2:
                    status = "error"
                self.served[model] = self.served.get(model, 0) + 1
                batch.append(Span(**self.stamper.stamp(), request_id=request_id, span_id=new_span_id(),
                                  name="llm_request", start_time=start, end_time=time.time(), model=model,
                                  status=status))
            self.sink.write(Span.topic, 0, self.offset, self.offset + len(batch) - 1, batch)
            self.offset += len(batch)


def test_canary_with_error_spike_is_rolled_back_automatically(vllm_server, trained, chdb_client):
    from entroloop.sinks.clickhouse.writer import ClickHouseSink

    registry, adapter_id, served, actions, database = trained
    sink = ClickHouseSink(chdb_client, database)
    router = CanaryRouter(MODEL)
    policy = CanaryPolicy(shares=(0.3, 0.6, 1.0), stage_seconds=6.0, checks_per_stage=2, min_requests=10,
                          error_rate_limit=0.03)
    publisher = AdapterPublisher([vllm_server], router, ClickHouseCanaryMetrics(chdb_client, database),
                                 policy, actions, registry)
    # The fault: from the second stage on, 20% of the canary's answers are errors.
    gateway = Gateway(vllm_server, router, sink, fault=lambda: router.share >= 0.6)
    gateway.thread.start()
    try:
        result = publisher.rollout(adapter_id, str(served))
    finally:
        gateway.stop.set()
        gateway.thread.join(60)
    print("rollout", result, "served", gateway.served)

    assert result.outcome == "rolled_back" and result.stage == 1 and result.share == 0.6
    assert "error rate" in result.reason
    assert adapter_id not in vllm_server.models()  # unloaded from the server
    assert router.choose("any-request") == MODEL and gateway.served.get(adapter_id, 0) >= 10
    assert registry.status(adapter_id) == "unloaded"
    statuses = [h[1] for h in registry.history(adapter_id)]
    assert statuses[-4:] == ["canary", "canary", "rolled_back", "unloaded"]

    # Every step is an Action record; written to ClickHouse they read back in order.
    mine = [a for a in actions.records if a.alert_key == adapter_id]
    sink.write(Action.topic, 0, 0, len(mine) - 1, mine)
    rows = chdb_client.query(
        f"SELECT action, outcome, detail FROM {database}.actions FINAL WHERE alert_key = %(a)s ORDER BY seq",
        parameters={"a": adapter_id},
    ).result_rows
    names = [r[0] for r in rows]
    print(names)
    assert names[:3] == ["adapter.registered", "adapter.loaded", "canary.stage"]
    assert names[-2:] == ["canary.rolled_back", "adapter.unloaded"]
    assert names.count("canary.stage") >= 2 and "canary.check" in names
    rolled = json.loads(rows[-2][2])
    assert rolled["now_serving"] == MODEL and "error rate" in rolled["reason"]
    assert rows[-1][1] == "ok"
