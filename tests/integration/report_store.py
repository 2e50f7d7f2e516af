"""A small store for the report's query tests, written the way production writes it: records built
by their producers' code (the bad-case joiner builds the bad cases, the adapter registry indexes
adapters) and stored by the ClickHouse sink into real chDB.

Two periods of traffic, ``EARLY`` and ``LATE`` (1,000 s apart), with figures chosen so every
section of the report has a known answer inside ``LATE_WINDOW`` and a different one over the
whole store: a query that ignores the window gets a visibly wrong result.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from entroloop.sinks.clickhouse.writer import ClickHouseSink
from entroloop.streams.bad_cases import BadCaseJoiner
from entroloop.training.actions import ActionLog
from entroloop.training.registry import AdapterRegistry

from entroloop.contract.ids import NodeStamper
from entroloop.contract.records import (
    Alert,
    Audit,
    Event,
    Feedback,
    Span,
    TokenEntropy,
    pack_entropies,
)
from entroloop.infra.worm.worm_store import LocalWormStore
from entroloop.report.window import ReportWindow

T0 = 1_790_000_000.0  # 2026-09-21 UTC
EARLY, LATE = T0, T0 + 1_000.0
LATE_WINDOW = ReportWindow(LATE - 10, LATE + 500)
SCRIPT = '<script>document.body.setAttribute("data-pwned","1")</script>'


@dataclass
class ReportStore:
    database: str
    late_request_ids: dict[str, str] = field(default_factory=dict)  # role -> request id
    early_request_ids: list[str] = field(default_factory=list)
    adapters: dict[str, str] = field(default_factory=dict)  # role -> adapter id
    promoted_until: float = 0.0  # a moment after a1 was promoted and before a2 replaced it
    registry_since: float = 0.0  # just before the adapters were registered


def _entropy(stamper: NodeStamper, at: float, request_id: str, model: str, values: list[float],
             chunk: int = 0, final: bool = True) -> TokenEntropy:
    return TokenEntropy(**stamper.stamp(at), request_id=request_id, model=model, route="support",
                        entropies=pack_entropies(values), chunk_index=chunk, final=final)


def _span(stamper: NodeStamper, at: float, request_id: str, model: str, name: str = "llm_request",
          **timings: Any) -> Span:
    return Span(**stamper.stamp(at), request_id=request_id, span_id=request_id[-16:].rjust(16, "0"), name=name,
                start_time=at - 1, end_time=at, model=model, route="support", **timings)


def fill(sink: ClickHouseSink, adapter_dir: Path) -> ReportStore:
    store = ReportStore(sink.database)
    node = NodeStamper("report-test-node")
    records: list[Event] = []

    # --- entropy: early m-a requests near 1 nat; late m-a near 2 nats plus one chunked request whose
    # token-weighted mean is 2.57 (its chunk means average 2.05); late m-b near 5 nats.
    for i in range(4):
        rid = f"early-{i}"
        store.early_request_ids.append(rid)
        records.append(_entropy(node, EARLY + i, rid, "m-a", [1.04] * 10))
        records.append(_span(node, EARLY + i, rid, "m-a", queue_s=9.0, prefill_s=9.0, decode_s=9.0, ttft_s=9.0,
                             tpot_s=9.0, e2e_s=27.0))
    for i in range(3):
        rid = f"late-a-{i}"
        store.late_request_ids[f"a{i}"] = rid
        records.append(_entropy(node, LATE + i, rid, "m-a", [2.04] * 20))
        records.append(_span(node, LATE + i, rid, "m-a", queue_s=0.01 * (i + 1), prefill_s=0.1 * (i + 1),
                             decode_s=1.0 * (i + 1), ttft_s=0.2 * (i + 1), tpot_s=0.01 * (i + 1),
                             e2e_s=1.11 * (i + 1), output_tokens=100))
    # the audit of late-a-0, with the client's trace id (the latest-requests table joins its span and entropy)
    records.append(Audit(**node.stamp(LATE + 0.5), request_id="late-a-0", trace_id="ab" * 16, audit_id="audit-late-a-0",
                         model="m-a", route="support", prompt="Hi", response="Hello"))
    store.late_request_ids["chunked"] = "late-a-chunked"
    records.append(_entropy(node, LATE + 5, "late-a-chunked", "m-a", [1.0] * 10, chunk=0, final=False))
    records.append(_entropy(node, LATE + 6, "late-a-chunked", "m-a", [3.1] * 30, chunk=1))
    for i in range(2):
        rid = f"late-b-{i}"
        store.late_request_ids[f"b{i}"] = rid
        records.append(_entropy(node, LATE + 10 + i, rid, "m-b", [5.04] * 8))
        # an engine that reports no stage timings, only the end-to-end time
        records.append(_span(node, LATE + 10 + i, rid, "m-b", e2e_s=4.0))
    # the gateway's own span of a request: not the engine's, kept out of the stage figures
    records.append(_span(node, LATE + 1, "late-a-0", "m-a", name="gateway /v1/chat/completions", ttft_s=50.0,
                         e2e_s=100.0))

    # --- audits, feedback and the bad cases the joiner builds from them
    joiner = BadCaseJoiner()
    answer = "The refund for order 4711 is 12.5 USD."
    cases = [
        (EARLY + 50, "early-case", "The refund for order 4711 is 12.7 USD.", -1),
        (LATE + 20, "late-case", "The refund for order 4711 is 12.8 USD.", -1),
        (LATE + 21, "late-script", f"The refund for order 4711 is {SCRIPT} 12.8 USD.", -1),
    ]
    for at, rid, correction, rating in cases:
        audit = Audit(**node.stamp(at - 5), request_id=rid, audit_id=f"audit-{rid}", model="m-a", route="billing",
                      prompt="How much is the refund for order 4711?", response=answer)
        feedback = Feedback(**node.stamp(at), request_id=rid, rating=rating, corrected_answer=correction,
                            error_type="wrong_amount")
        records += [audit, feedback, joiner.build(audit, feedback)]
    store.late_request_ids["case"], store.late_request_ids["script"] = "late-case", "late-script"
    records.append(Feedback(**node.stamp(LATE + 22), request_id="late-a-1", rating=1))  # a thumbs up
    # a tenant that learned the request id of another tenant's answer (served before the window) rates it
    # down in the window: not in the funnel
    records.append(Audit(**node.stamp(EARLY + 60), request_id="early-acme", audit_id="audit-early-acme", model="m-a",
                         route="support", prompt="Hi", response="Hello", tenant="acme"))
    records.append(Feedback(**node.stamp(LATE + 23), request_id="early-acme", rating=-1, tenant="rival"))
    records.append(Alert(**node.stamp(EARLY + 3), request_id="early-1", alert_key="k-early", rule="repetition_loop",
                         model="m-a", value=0.4, threshold=1.5))
    records.append(Alert(**node.stamp(LATE + 11), request_id="late-b-1", alert_key="k-late", rule="gibberish",
                         model="m-b", value=5.04, threshold=4.5, detail="sustained 5.04 nats"))

    by_topic: dict[str, list[Event]] = {}
    for record in records:
        by_topic.setdefault(record.topic, []).append(record)
    for topic, batch in by_topic.items():
        sink.write(topic, 0, 0, len(batch) - 1, batch)

    # --- adapters, through the registry the trainer uses (its clock is now, not T0)
    registry = AdapterRegistry(LocalWormStore(adapter_dir / "worm"), sink.client, sink.database, ActionLog())
    store.registry_since = time.time() - 1
    for role, model, weights in (("a1", "m-a", b"one"), ("a2", "m-a", b"two"), ("a3", "m-a", b"three"),
                                 ("b1", "m-b", b"four")):
        folder = adapter_dir / role
        folder.mkdir(parents=True)
        (folder / "adapter_config.json").write_text('{"r": 8}')
        (folder / "adapter_model.safetensors").write_bytes(weights)
        metrics = {"gate": {"adapter_pass_rate": 0.9, "parent_pass_rate": 0.5, "accepted": True},
                   "train": {"steps": 12}}
        store.adapters[role] = registry.register(folder, model=model, base_model_digest="base", dataset_digest=role,
                                                 metrics=metrics).adapter_id
        time.sleep(0.01)  # registration order is the version order
    a1, a2, a3 = store.adapters["a1"], store.adapters["a2"], store.adapters["a3"]
    registry.set_status(a1, "canary", share=0.1)
    registry.set_status(a1, "promoted")
    time.sleep(0.01)
    store.promoted_until = time.time()
    time.sleep(0.01)
    registry.set_status(a2, "canary", share=0.1)
    registry.set_status(a2, "promoted")
    registry.set_status(a1, "superseded")
    registry.set_status(a3, "canary", share=0.1)
    registry.set_status(a3, "rolled_back", detail="canary worse than the promoted adapter")
    return store


__all__ = ["EARLY", "LATE", "LATE_WINDOW", "SCRIPT", "ReportStore", "fill"]
