"""The vLLM versions the serving plugins are tested with, and a warning when the engine is another.

The entropy tap and the span exporter ride on interfaces vLLM calls unstable: the two
logits-processor interfaces (V1's ``vllm.v1.sample.logits_processor.LogitsProcessor`` and Model
Runner V2's ``vllm.v1.worker.gpu.sample.logits_processor.LogitsProcessor``), the
``vllm.logits_processors`` and ``vllm.general_plugins`` entry-point groups, the global OTel tracer
provider vLLM's request span uses and that span's attribute names. What is tested (the vLLM
integration tests, in ``.venv-ml`` built by ``scripts/install_ml_env.sh``) is vLLM ``TESTED_VLLM``
(the CPU build); the supported range is that minor release.

Outside the range the plugins still load — a newer vLLM usually works — but one warning says so at
load time, naming the range and what to do, instead of records silently stopping. Never raises:
a version check must not keep an engine from serving.
"""

from __future__ import annotations

import logging
import re

log = logging.getLogger(__name__)

TESTED_VLLM = "0.32.0"
# [lowest, first unsupported): the tested minor release
SUPPORTED_VLLM = ((0, 32), (0, 33))
SUPPORTED_VLLM_TEXT = ">=0.32,<0.33"

_VERSION = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?")
_warned = False


def parse_version(version: str) -> tuple[int, int, int] | None:
    """(major, minor, patch) of ``0.32.0``, ``0.32.1+cpu``, ``0.33.0rc1.dev5+g1234``; None if unreadable."""
    match = _VERSION.match(version.strip())
    if not match:
        return None
    major, minor, patch = match.groups()
    return int(major), int(minor), int(patch or 0)


def is_supported(version: str) -> bool:
    parsed = parse_version(version)
    if parsed is None:
        return False
    low, high = SUPPORTED_VLLM
    return low <= parsed[:2] < high


def unsupported_message(version: str) -> str | None:
    """The warning for an engine of ``version``, or None inside the supported range."""
    if is_supported(version):
        return None
    what = f"vLLM {version}" if parse_version(version) else f"vLLM of unreadable version {version!r}"
    return (f"entroloop: {what} is outside the supported range {SUPPORTED_VLLM_TEXT} (tested: {TESTED_VLLM}); "
            "the entropy tap and the span exporter use vLLM interfaces that change between releases. If "
            "TokenEntropy or Span records stop, pin vLLM to that range or set ENTROLOOP_ENTROPY_TAP_ENABLED=false "
            "(docs/deployment.md, 'Supported vLLM versions').")


def warn_if_unsupported(version: str, logger: logging.Logger | None = None) -> bool:
    """Log the warning once per process when ``version`` is outside the range; True if it was logged."""
    global _warned
    message = unsupported_message(version)
    if message is None or _warned:
        return False
    _warned = True
    (logger or log).warning(message)
    return True


__all__ = ["SUPPORTED_VLLM", "SUPPORTED_VLLM_TEXT", "TESTED_VLLM", "is_supported", "parse_version",
           "unsupported_message", "warn_if_unsupported"]
