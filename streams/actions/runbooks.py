"""Runbooks: versioned YAML files that say which alerts trigger which actions.

A runbook is configuration, not code: the package ships a set (``streams/actions/builtin_runbooks``);
operators point ``ENTROLOOP_ACTIONS_RUNBOOKS_DIR`` at their own folder, edit a file and bump its ``version``; the Action records carry name and version so the audit trail says
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
* ``unload_adapter``: POST the gateway's ``/admin/adapters/{adapter}/unload`` (the gateway unloads it
  from vLLM and stops routing to it), body ``{"lora_name": "{adapter}"}``; with ``endpoint: vllm``
  (no gateway in front) the default path is vLLM's own ``/v1/unload_lora_adapter``.
* ``rollback_adapter``: POST the gateway's ``/admin/adapters/{adapter}/rollback`` (requests routed to
  the adapter go to its base model; it stays loaded).
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

StepKind = Literal["pause_node", "pause_route", "switch_fallback", "unload_adapter", "rollback_adapter", "capture_bundle",
                   "open_retrain"]

# What a template may refer to: the alert's fields plus the resolved adapter.
TEMPLATE_FIELDS = frozenset(
    {"rule", "model", "route", "subject_node", "alert_key", "severity", "request_id", "value", "threshold", "adapter"}
)
WEBHOOK_KINDS = {"pause_node": "gateway", "pause_route": "gateway", "switch_fallback": "gateway",
                 "unload_adapter": "gateway", "rollback_adapter": "gateway"}
DEFAULT_PATHS = {
    ("pause_node", "gateway"): "/admin/nodes/{subject_node}/pause",
    ("pause_route", "gateway"): "/admin/routes/{route}/pause",
    ("switch_fallback", "gateway"): "/admin/routes/{route}/tier",
    ("unload_adapter", "gateway"): "/admin/adapters/{adapter}/unload",
    ("unload_adapter", "vllm"): "/v1/unload_lora_adapter",
    ("rollback_adapter", "gateway"): "/admin/adapters/{adapter}/rollback",
}
BUILTIN_RUNBOOKS_DIR = Path(__file__).resolve().parent / "builtin_runbooks"
RUNBOOKS_SETTING = "ENTROLOOP_ACTIONS_RUNBOOKS_DIR"
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
    endpoint_name: Literal["gateway", "vllm"] | None = Field(None, alias="endpoint")
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
        if self.endpoint_name is not None and (self.kind not in WEBHOOK_KINDS or
                                               (self.path is None and (self.kind, self.endpoint_name) not in DEFAULT_PATHS)):
            raise ValueError(f"endpoint {self.endpoint_name!r} needs a webhook step kind and, for {self.kind}, a path")
        return self

    @property
    def endpoint(self) -> str | None:
        """Which configured base URL a webhook step posts to (None: not a webhook)."""
        if self.kind not in WEBHOOK_KINDS:
            return None
        return self.endpoint_name or WEBHOOK_KINDS[self.kind]

    @property
    def url_path(self) -> str:
        return self.path or DEFAULT_PATHS[(self.kind, self.endpoint or "")]


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
        folder = paths
        if not folder.is_dir():
            raise RunbookError(f"{folder}: runbook folder not found")
        paths = sorted([*folder.glob("*.yaml"), *folder.glob("*.yml")])
        if not paths:
            raise RunbookError(f"{folder}: no *.yaml runbook in the folder")
    runbooks: dict[str, Runbook] = {}
    for path in paths:
        runbook = parse_runbook(path.read_text(encoding="utf-8"), str(path))
        if runbook.name in runbooks:
            raise RunbookError(f"{path}: runbook name {runbook.name!r} is used twice")
        runbooks[runbook.name] = runbook
    return [runbooks[name] for name in sorted(runbooks)]


def runbooks_from_settings(settings: object) -> list[Runbook]:
    """The runbooks ``ENTROLOOP_ACTIONS_RUNBOOKS_DIR`` names (empty: the packaged ones), checked at start.

    A missing folder, an empty one or an invalid runbook raises ``RunbookError`` naming the setting
    and the fix: an action runner that silently runs no runbook looks healthy while doing nothing."""
    configured = getattr(settings, "actions_runbooks_dir", None)
    folder = Path(configured) if configured else BUILTIN_RUNBOOKS_DIR
    try:
        return load_runbooks(folder)
    except RunbookError as exc:
        source = f"{RUNBOOKS_SETTING}={configured}" if configured else "the packaged runbooks"
        raise RunbookError(
            f"{exc} ({source}). Fix: point {RUNBOOKS_SETTING} at a folder of valid *.yaml runbooks "
            f"(format: docs/runbooks.md), or unset it to use the packaged ones in {BUILTIN_RUNBOOKS_DIR}"
        ) from None


__all__ = ["BUILTIN_RUNBOOKS_DIR", "RUNBOOKS_SETTING", "runbooks_from_settings", "Match", "RateLimit", "Runbook", "RunbookError", "Step", "StepKind", "TEMPLATE_FIELDS", "load_runbooks", "parse_runbook"]
