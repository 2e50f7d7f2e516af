"""`entroloop actions` against the real broker and a real local webhook receiver, with the packaged
runbooks: alerts published -> webhooks called -> Action records on the actions topic; a poison
record goes to the dead-letter topic; a restart calls no webhook twice; records a crash kept from
Kafka (finished in the state, not yet delivered) are delivered at the next start; a burst killed
(SIGKILL) in the middle of its batch loses no action and repeats none."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from entroloop.streams.actions import ActionRunner

from entroloop.contract import codec
from entroloop.contract.records import Action, Alert, DeadLetter, RetrainRequest
from entroloop.contract.settings import load_settings
from entroloop.contract.topics import TOPIC_BY_TYPE
from entroloop.infra.kafka_topics import ensure_topics
from tests.integration.conftest import REPO_ROOT
from tests.integration.test_publisher_kafka import consume_all
from tests.integration.acknowledged_producer import AcknowledgedProducer

pytestmark = pytest.mark.kafka

PARTITIONS = 2
AT = 1_790_000_000.0


@pytest.fixture
def actions_env(kafka_bootstrap: str, topic_prefix: str, tmp_path: Path, receiver) -> dict[str, str]:
    ensure_topics(kafka_bootstrap, topic_prefix, PARTITIONS,
                  topics=[TOPIC_BY_TYPE[t] for t in (Alert, Action, RetrainRequest, DeadLetter)])
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENTROLOOP_")}
    env.update({
        "ENTROLOOP_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "ENTROLOOP_TOPIC_PREFIX": topic_prefix,
        "ENTROLOOP_PARTITIONS": str(PARTITIONS),
        "ENTROLOOP_DATA_DIR": str(tmp_path / "data"),
        "ENTROLOOP_NODE_ID": "actions-test",
        "ENTROLOOP_ACTIONS_DRY_RUN": "false",
        "ENTROLOOP_ACTIONS_GATEWAY_URL": receiver.url,
        "ENTROLOOP_ACTIONS_WEBHOOK_ATTEMPTS": "1",
        # no ENTROLOOP_ACTIONS_RUNBOOKS_DIR: the packaged runbooks
    })
    return env


def alert(n: int, rule: str = "fallback_circuit_breaker", key: str | None = None) -> Alert:
    from entroloop.contract.ids import derived_event_id

    return Alert(event_id=derived_event_id(f"alert-{rule}-{n}", "alert", at=AT + n), emitted_at=AT + n, node_id="worker",
                 seq=n, request_id=f"req-{n}", alert_key=key or f"{rule}:route-{n}", rule=rule, severity="critical",
                 model="m", route=f"route-{n}", subject_node="node-1", value=0.9, threshold=0.5)


def produce(bootstrap: str, prefix: str, items: list[tuple[str, bytes]]) -> None:
    producer = AcknowledgedProducer({"bootstrap.servers": bootstrap})
    for key, value in items:
        producer.produce(prefix + Alert.topic, key=key.encode(), value=value)
    assert producer.flush(30) == 0


def run_actions(env: dict[str, str]) -> dict:
    proc = subprocess.run([sys.executable, "-m", "entroloop.cli", "actions", "--until-idle", "--json"], cwd=REPO_ROOT,
                          env=env, capture_output=True, text=True, timeout=180, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_alerts_call_webhooks_once_and_publish_actions(kafka_bootstrap, topic_prefix, actions_env, receiver):
    alerts = [alert(n) for n in range(3)]
    repeat = alert(9, key=alerts[0].alert_key)  # the same finding alerted again (a new event)
    produce(kafka_bootstrap, topic_prefix, [
        *[(a.request_id, codec.encode(a)) for a in alerts],
        ("bad", b"\x00 not a record"),
        (repeat.request_id, codec.encode(repeat)),
        ("other", codec.encode(alert(5, rule="no_runbook_for_this"))),
    ])

    stats = run_actions(actions_env)

    assert (stats["messages"], stats["handled"], stats["dead_letters"]) == (6, 5, 1), stats
    assert stats["committed"] == 6 and stats["published"] == {Action.topic: 3}, stats
    assert stats["outcomes"]["ok"] == 3 and stats["outcomes"]["duplicates"] == 1, stats
    assert sorted(receiver.paths()) == [f"/admin/routes/route-{n}/tier" for n in range(3)]
    assert all(r.body["tier"] == "fallback" for r in receiver.requests)

    actions = [r for r in consume_all(kafka_bootstrap, [topic_prefix + Action.topic], 3) if isinstance(r, Action)]
    assert sorted(a.alert_key for a in actions) == sorted(a.alert_key for a in alerts)
    assert {(a.action, a.outcome, a.runbook, a.dry_run) for a in actions} == {
        ("switch_fallback", "ok", "fallback-on-circuit-breaker", False)}
    assert {r.headers["Idempotency-Key"] for r in receiver.requests} == {a.action_id for a in actions}
    dead = [r for r in consume_all(kafka_bootstrap, [topic_prefix + DeadLetter.topic], 1) if isinstance(r, DeadLetter)]
    assert len(dead) == 1 and dead[0].source_topic == Alert.topic and dead[0].payload == b"\x00 not a record"

    # restart: everything was committed, nothing is read or called again
    again = run_actions(actions_env)
    assert (again["messages"], again["resent_at_start"]) == (0, 0), again
    assert len(receiver.requests) == 3


def test_records_a_crash_kept_from_kafka_are_delivered_at_the_next_start(kafka_bootstrap, topic_prefix, actions_env,
                                                                          receiver):
    """The runner finished an execution (webhook called, records in the outbox) and died before its
    records reached Kafka and before the alert's offset was committed."""
    crashed = alert(1)
    settings = load_settings(**{k.removeprefix("ENTROLOOP_").lower(): v for k, v in actions_env.items()
                                if k.startswith("ENTROLOOP_")})
    runner = ActionRunner.from_settings(settings, outbox=True)
    produced = runner.process(crashed)
    runner.state.close()
    assert len(receiver.requests) == 1 and len(produced) == 1
    produce(kafka_bootstrap, topic_prefix, [(crashed.request_id, codec.encode(crashed))])

    stats = run_actions(actions_env)

    assert stats["resent_at_start"] == 1 and stats["outcomes"] == {"duplicates": 1}, stats
    assert len(receiver.requests) == 1  # the webhook was not called again
    actions = [r for r in consume_all(kafka_bootstrap, [topic_prefix + Action.topic], 1) if isinstance(r, Action)]
    assert [a.event_id for a in actions] == [produced[0].event_id]


BURST_RUNBOOK = """
name: fallback-burst
version: 1
match: {rules: [fallback_circuit_breaker]}
steps:
  - kind: switch_fallback
"""


def test_a_burst_killed_mid_batch_loses_no_action_and_repeats_none(kafka_bootstrap, topic_prefix, actions_env,
                                                                     receiver, tmp_path):
    """40 findings, 20 of them alerted twice, to a slow gateway (no rate limit: every finding acts).
    SIGKILL once a few webhooks were answered, i.e. in the middle of the batch: executions finished
    (records in the outbox, nothing delivered or committed), one running, the rest not started.
    After a restart: one Action per finding, each finding's webhook applied under one
    Idempotency-Key, and no finished execution called again."""
    runbooks = tmp_path / "runbooks"
    runbooks.mkdir()
    (runbooks / "burst.yaml").write_text(BURST_RUNBOOK)
    env = {**actions_env, "ENTROLOOP_ACTIONS_RUNBOOKS_DIR": str(runbooks)}
    burst = [alert(n, key=f"fallback_circuit_breaker:finding-{n % 40}") for n in range(60)]
    produce(kafka_bootstrap, topic_prefix, [(a.request_id, codec.encode(a)) for a in burst])
    receiver.delay_s = 0.1  # a slow gateway: the batch takes a while

    # a short session: the restarted runner waits for the killed one's session to expire before it gets the partitions
    proc = subprocess.Popen([sys.executable, "-m", "entroloop.cli", "actions", "--concurrency", "2", "--session-timeout-s",
                             "6"], cwd=REPO_ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while len(receiver.requests) < 8 and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.poll() is None and len(receiver.requests) >= 8, proc.stderr.read() if proc.poll() is not None else ""
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()
    called_before = Counter(r.headers["Idempotency-Key"] for r in receiver.requests)
    assert len(called_before) < 40  # killed mid-batch, not after it

    stats = run_actions(env)

    assert stats["resent_at_start"] > 0, stats  # executions the kill caught finished but undelivered
    actions = [r for r in consume_all(kafka_bootstrap, [topic_prefix + Action.topic], 40) if isinstance(r, Action)]
    by_id = {a.event_id: a for a in actions}
    assert sorted(a.alert_key for a in by_id.values()) == sorted({a.alert_key for a in burst})  # one each, none lost
    assert {a.outcome for a in by_id.values()} == {"ok"}
    called = Counter(r.headers["Idempotency-Key"] for r in receiver.requests)
    assert set(called) == {a.action_id for a in by_id.values()}  # every finding acted, under its action id
    # A finding is called twice only if the kill caught its execution running (same Idempotency-Key,
    # which the gateway answers from memory); at concurrency 2, at most 2 were.
    repeated = {key for key, n in called.items() if n > 1}
    assert all(called[key] == 2 for key in repeated) and len(repeated) <= 2, called
    assert repeated <= set(called_before)
