"""The gateway and its pseudonymisation key: refused in production without one, loud in the demo.

Without ``ENTROLOOP_PII_HASH_KEY`` every process draws a random key, so the same e-mail gets
another pseudonym on each gateway and after each restart: joins by user and correction diffs
break without anyone noticing. Issue 12: the gateway started with no key and no warning.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
from entroloop.collectors.gateway.app import app_from_settings
from pydantic import SecretStr

from entroloop.contract.settings import Settings, SettingsError

KEY = "a-test-key-of-enough-length-0123"


def _published() -> list:
    return []


def test_production_mode_refuses_to_build_the_gateway_without_a_key() -> None:
    with pytest.raises(SettingsError) as caught:
        app_from_settings(Settings(mode="production"), publish=_published().append)
    message = str(caught.value)
    assert "ENTROLOOP_PII_HASH_KEY" in message and "openssl rand" in message and "production" in message


def test_production_mode_with_a_key_starts_without_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        app = app_from_settings(Settings(mode="production", pii_hash_key=SecretStr(KEY)), publish=_published().append)
    assert not app.state.gateway.redactor.ephemeral
    assert not [r for r in caplog.records if "ENTROLOOP_PII_HASH_KEY" in r.getMessage()]


def test_demo_mode_without_a_key_warns_loudly_once(caplog: pytest.LogCaptureFixture, monkeypatch) -> None:
    from entroloop.infra import pii

    monkeypatch.setattr(pii, "_WARNED_WITHOUT_KEY", set())  # as in a fresh process
    with caplog.at_level(logging.WARNING):
        app = app_from_settings(Settings(mode="demo"), publish=_published().append)
        app_from_settings(Settings(mode="demo"), publish=_published().append)  # the same process again
    assert app.state.gateway.redactor.ephemeral
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "ENTROLOOP_PII_HASH_KEY" in r.getMessage()]
    assert len(warnings) == 1 and "demo" in warnings[0].getMessage()


def test_gateway_command_exits_2_naming_the_variable_in_production() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("ENTROLOOP_")}
    env |= {"ENTROLOOP_MODE": "production", "ENTROLOOP_KAFKA_BOOTSTRAP": ""}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "entroloop.cli", "gateway", "--upstream", "http://127.0.0.1:9", "--port", "1"],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the gateway started in production mode without ENTROLOOP_PII_HASH_KEY")
    assert done.returncode == 2, done.stderr
    stderr = " ".join(done.stderr.split())
    assert "ENTROLOOP_PII_HASH_KEY" in stderr and "Traceback" not in stderr
