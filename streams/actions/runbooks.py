"""Runbooks: versioned YAML files that say which alerts trigger which actions.

A runbook is configuration, not code: operators add or change one by editing ``runbooks/*.yaml``
and bumping its ``version``; the Action records carry name and version so the audit trail says
exactly which runbook revision acted. Example::

    name: pause-node-on-gibberish
    version: 2
    description: A node producing gibberish is likely broken; stop routing traffic to it.
    match:
      rules: [gibberish]              # Alert.rule values (required)
      severities: [warning, critical] # optional
      min_value: 0                    # optional: Alert.value >= this
    dry_run: false                    # true: this runbook never acts for real
    rate_limit: {max: 3, per_s: 600}  # at most 3 executions per 10 minutes (per runbook)
    on_failure: stop                  # stop | continue with the next step
    steps:
      - kind: pause_node
        duration_s: 300

Step kinds (``kind``) and their parameters:

* ``pause_node`` / ``pause_route``: POST to the gateway admin webhook
  (``path`` default ``/admin/nodes/{subject_node}/pause`` / ``/admin/routes/{route}/pause``),
  body ``{node|route, model, reason, alert_key, duration_s}``.
* ``switch_fallback``: POST ``/admin/routes/{route}/tier`` with ``{"tier": tier}`` (default ``fallback``).
* ``unload_adapter``: POST vLLM's ``/v1/unload_lora_adapter`` with ``{"lora_name": "{adapter}"}``.
* ``capture_bundle``: the last ``last_n`` anomalous requests like this one (same model, route and
  rule by default: ``scope``) with their audit records, token entropies, spans and alerts, written
  as one JSON file.
* ``open_retrain``: emit a ``RetrainRequest`` (``category`` default the alert's rule).

``path``, ``lora_name``, ``reason`` and ``category`` are templates over the alert's fields
(``{rule}``, ``{model}``, ``{route}``, ``{subject_node}``, ``{alert_key}``, ``{severity}``,
``{request_id}``, ``{value}``, ``{threshold}``) and ``{adapter}`` (the adapter that served the
alerted request, looked up by the runner).
"""

from __future__ import annotations

import string
from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)

StepKind = Literal["pause_node", "pause_route", "switch_fallback", "unload_adapter", "capture_bundle", "open_retrain"]

# What a template may refer to: the alert's fields plus the resolved adapter.
TEMPLATE_FIELDS = frozenset(
    {"rule", "model", "route", "subject_node", "alert_key", "severity", "request_id", "value", "threshold", "adapter"}
)
WEBHOOK_KINDS = {"pause_node": "gateway", "pause_route": "gateway", "switch_fallback": "gateway", "unload_adapter": "vllm"}
DEFAULT_PATHS = {
    "pause_node": "/admin/nodes/{subject_node}/pause",
    "pause_route": "/admin/routes/{route}/pause",
    "switch_fallback": "/admin/routes/{route}/tier",
    "unload_adapter": "/v1/unload_lora_adapter",
}
BUNDLE_SCOPES = frozenset({"model", "route", "rule", "subject_node"})


class RunbookError(ValueError):
    """A runbook file that cannot be used, with the file and the reason."""


def _template_fields(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Match(_Strict):
    rules: tuple[str, ...] = Field(min_length=1)
    severities: tuple[str, ...] = ()
    min_value: float | None = None


class RateLimit(_Strict):
    max: int = Field(ge=1)
    per_s: float = Field(gt=0)


class Step(_Strict):
    kind: StepKind
    path: str | None = None
    duration_s: float = Field(300.0, gt=0)
    tier: str = "fallback"
    lora_name: str = "{adapter}"
    last_n: int = Field(20, ge=1, le=10_000)
    scope: tuple[str, ...] = ("model", "route", "rule")
    category: str = "{rule}"
    reason: str = "alert {rule} ({alert_key}): value {value} over threshold {threshold}"

    @model_validator(mode="after")
    def _templates_known(self) -> Step:
        for name in ("path", "lora_name", "category", "reason"):
            template = getattr(self, name)
            unknown = _template_fields(template or "") - TEMPLATE_FIELDS
            if unknown:
                raise ValueError(f"{name} refers to unknown field(s) {sorted(unknown)}; known: {sorted(TEMPLATE_FIELDS)}")
        if set(self.scope) - BUNDLE_SCOPES:
            raise ValueError(f"scope may only use {sorted(BUNDLE_SCOPES)}")
        return self

    @property
    def endpoint(self) -> str | None:
        """Which configured base URL a webhook step posts to (None: not a webhook)."""
        return WEBHOOK_KINDS.get(self.kind)

    @property
    def url_path(self) -> str:
        return self.path or DEFAULT_PATHS[self.kind]


class Runbook(_Strict):
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]{0,62}$")
    version: str
    description: str = ""
    match: Match
    dry_run: bool = False
    rate_limit: RateLimit | None = None
    on_failure: Literal["stop", "continue"] = "stop"
    steps: tuple[Step, ...] = Field(min_length=1, max_length=32)

    @field_validator("version", mode="before")
    @classmethod
    def _version_text(cls, value: object) -> str:
        if isinstance(value, bool) or not isinstance(value, (str, int)) or str(value).strip() == "":
            raise ValueError("version must be a non-empty string or integer")
        return str(value)

    def matches(self, rule: str, severity: str, value: float) -> bool:
        if rule not in self.match.rules:
            return False
        if self.match.severities and severity not in self.match.severities:
            return False
        return self.match.min_value is None or value >= self.match.min_value


def parse_runbook(text: str, source: str = "<string>") -> Runbook:
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise RunbookError(f"{source}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise RunbookError(f"{source}: a runbook is a YAML mapping")
    try:
        return Runbook.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise RunbookError(f"{source}: {problems}") from None


def load_runbooks(paths: Iterable[Path] | Path) -> list[Runbook]:
    """Every ``*.yaml``/``*.yml`` runbook in a folder (or the given files), sorted by name.

    Two files with the same runbook name are an error: idempotency and rate limits are per name.
    """
    if isinstance(paths, Path):
        if not paths.is_dir():
            raise RunbookError(f"{paths}: runbook folder not found")
        paths = sorted([*paths.glob("*.yaml"), *paths.glob("*.yml")])
    runbooks: dict[str, Runbook] = {}
    for path in paths:
        runbook = parse_runbook(path.read_text(encoding="utf-8"), str(path))
        if runbook.name in runbooks:
            raise RunbookError(f"{path}: runbook name {runbook.name!r} is used twice")
        runbooks[runbook.name] = runbook
    return [runbooks[name] for name in sorted(runbooks)]


__all__ = ["Match", "RateLimit", "Runbook", "RunbookError", "Step", "StepKind", "TEMPLATE_FIELDS", "load_runbooks", "parse_runbook"]
