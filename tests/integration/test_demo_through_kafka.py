"""`entroloop demo --broker`: the same fleet and verdict as the embedded demo, through a real broker,
a real `entroloop worker` process, the two sink processes and the `entroloop actions` runner."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.kafka


def test_demo_through_kafka_loses_nothing_and_finds_everything(kafka_bootstrap, topic_prefix, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENTROLOOP_")}
    env["ENTROLOOP_TOPIC_PREFIX"] = topic_prefix
    proc = subprocess.run(
        [sys.executable, "-m", "entroloop.cli", "demo", "--requests", "600", "--data-dir", str(tmp_path / "d"),
         "--broker", f"kafka://{kafka_bootstrap}", "--json"],
        capture_output=True, text=True, env=env, timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["transport"] == f"kafka://{kafka_bootstrap}"
    assert summary["events_emitted"]["entroloop.tokens.v1"] == 600
    publisher = summary["publisher"]
    assert publisher["failed"] == publisher["dropped"] == 0, (publisher, proc.stderr[-3000:])
    assert summary["lost"] == {}, (summary["lost"], publisher, proc.stderr[-3000:])
    for topic, emitted in summary["events_emitted"].items():
        assert summary["stored"][topic] == emitted, topic
    assert summary["dead_letters"] == summary["malformed_injected"] > 0
    assert summary["audit_records"] == 600
    assert summary["anomalies"]["recall"] >= 0.95 and summary["anomalies"]["precision"] >= 0.9
    assert summary["bad_cases"]["right_label"] == summary["bad_cases"]["corrections_injected"] > 0
    # the alerts' runbooks ran in `entroloop actions` and their Action records were stored
    assert summary["stored"]["entroloop.actions.v1"] == summary["events_emitted"]["entroloop.actions.v1"] > 0
