"""Alert actions: versioned YAML runbooks executed once per alert key, with dry runs, rate limits,
retried webhooks and an Action record for everything done (or not done, and why)."""

from entroloop.streams.actions.case_bundle import client_query
from entroloop.streams.actions.runbooks import (
    Runbook,
    RunbookError,
    load_runbooks,
    parse_runbook,
)
from entroloop.streams.actions.runner import ActionRunner
from entroloop.streams.actions.state import ActionState
from entroloop.streams.actions.webhook import WebhookClient, WebhookResult

__all__ = [
    "ActionRunner",
    "ActionState",
    "Runbook",
    "RunbookError",
    "WebhookClient",
    "WebhookResult",
    "client_query",
    "load_runbooks",
    "parse_runbook",
]
