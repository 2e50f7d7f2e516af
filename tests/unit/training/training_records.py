"""Record builders shared by the training unit tests."""

from __future__ import annotations

import time

from entroloop.contract.ids import NodeStamper
from entroloop.contract.records import Audit, BadCase, Feedback, RetrainRequest

_stamper = NodeStamper("test-node")


def retrain_request(trigger_key: str = "model-a/format/2026-11-29T08", model: str = "model-a") -> RetrainRequest:
    return RetrainRequest(
        **_stamper.stamp(), request_id=trigger_key, trigger_key=trigger_key, model=model,
        category="format", reason="error_rate", bad_case_count=3,
    )


def bad_case(prompt: str, correction: str, at: float | None = None, model: str = "model-a") -> BadCase:
    stamp = _stamper.stamp(at)
    return BadCase(**stamp, request_id=f"r-{stamp['seq']}", model=model, prompt=prompt,
                   response="wrong answer", correction=correction)


def audit(prompt: str, response: str, request_id: str, model: str = "model-a", tenant: str = "") -> Audit:
    return Audit(**_stamper.stamp(), request_id=request_id, audit_id=f"a-{request_id}", model=model,
                 prompt=prompt, response=response, tenant=tenant)


def feedback(request_id: str, rating: int, tenant: str = "") -> Feedback:
    return Feedback(**_stamper.stamp(time.time()), request_id=request_id, rating=rating, tenant=tenant)
