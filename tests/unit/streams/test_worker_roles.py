"""Worker roles: with several workers, each reads some partitions of topics keyed by request id. The
per-request processors give the same results that way; the aggregating ones do not, so they run in
one worker of their own (`entroloop worker --role aggregates`)."""

from __future__ import annotations

import pytest
from entroloop.collectors.synthetic_fleet import SyntheticFleet
from entroloop.streams.defaults import (
    APP_ID_OF_ROLE,
    WORKER_ROLES,
    default_processors,
    processors_for_role,
)
from entroloop.streams.fallback_rates import FallbackRateMonitor
from typer.testing import CliRunner

from entroloop.cli import app
from entroloop.contract.records import Health
from entroloop.contract.settings import Settings
from entroloop.contract.topics import partition_for


def names(processors) -> set[str]:
    return {p.name for p in processors}


def test_the_roles_split_every_processor_once_and_the_aggregates_have_a_group_of_their_own() -> None:
    settings = Settings()
    every = names(default_processors(settings, with_intent=False))
    requests = names(processors_for_role(settings, "requests", with_intent=False))
    aggregates = names(processors_for_role(settings, "aggregates", with_intent=False))
    assert names(processors_for_role(settings, "all", with_intent=False)) == every
    assert requests | aggregates == every and not requests & aggregates
    assert aggregates == {"fallback_rates", "response_rules", "retrain_triggers"}
    assert APP_ID_OF_ROLE["aggregates"] != APP_ID_OF_ROLE["requests"] == APP_ID_OF_ROLE["all"]
    assert set(APP_ID_OF_ROLE) == set(WORKER_ROLES)
    with pytest.raises(ValueError, match="all, requests, aggregates"):
        processors_for_role(settings, "everything")


def test_the_worker_command_refuses_an_unknown_role_and_names_the_choices() -> None:
    result = CliRunner().invoke(app, ["worker", "--role", "aggregate", "--broker", "127.0.0.1:1"])
    assert result.exit_code == 2
    text = " ".join(result.output.replace("│", " ").split())  # the error box wraps its lines
    assert "--role: 'aggregate': choose one of all, requests, aggregates" in text


def _windows(monitor: FallbackRateMonitor, records) -> dict[str, tuple[str, str]]:
    out = monitor.process_batch(records) + monitor.on_watermark(2e10)
    return {h.event_id: (h.labels["requests"], h.labels["fallbacks"]) for h in out
            if isinstance(h, Health) and h.metric == "fallback_rate_1m"}


def test_why_fallback_rates_need_one_worker_two_halves_publish_one_window_id_with_other_counts() -> None:
    """The reason for the aggregates role: a worker holding half the partitions publishes each
    window under the same event id as the whole, with half the counts. The sinks keep one record
    per event id, so which half is stored is chance, and the SLO and the circuit breaker judge a
    share."""
    records = [r for request in SyntheticFleet(seed=11).requests(3000) for r in request.records]
    inputs = [r for r in records if isinstance(r, FallbackRateMonitor.inputs)]
    whole = _windows(FallbackRateMonitor(), inputs)
    first_half = _windows(FallbackRateMonitor(), [r for r in inputs if partition_for(r.request_id) < 3])
    assert whole and set(first_half) <= set(whole)
    differ = [event_id for event_id in first_half if first_half[event_id] != whole[event_id]]
    assert len(differ) == len(first_half)
