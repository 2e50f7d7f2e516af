"""Which secret values a service refuses to start with.

``.env.example`` and tutorials ship placeholders (``change-me-…``, ``changeme``, ``minioadmin``);
a deployment that copies them runs with passwords everybody knows. ``docker compose``'s
``${VAR:?}`` only catches an *empty* value, so the check lives here, where every entroloop
service loads its settings: a known placeholder is refused in every mode, and in
``ENTROLOOP_MODE=production`` the secrets a production deployment needs must be set and not short.

Messages name the variable and the fix, never the value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pydantic import SecretStr

# Values that only ever appear as placeholders in examples, docs and default installs.
PLACEHOLDERS = frozenset({
    "changeme", "change-me", "change_me", "change me", "changeit", "replaceme", "replace-me", "replace_me",
    "password", "passwd", "password1", "password123", "passw0rd", "p@ssw0rd", "secret", "mysecret",
    "default", "admin", "root", "toor", "test", "example", "xxx", "xxxx", "todo", "fixme", "123456",
    "12345678", "letmein", "minioadmin", "minio123", "clickhouse", "grafana", "entroloop",
})
PLACEHOLDER_PREFIXES = ("change-me", "changeme", "change_me", "replace-me", "replaceme", "replace_me",
                        "your-", "your_", "<", "${")
# production secrets shorter than this are refused (guessable; a 24-byte random base64 is 32 chars)
MIN_PRODUCTION_LENGTH = 16
FIX = "set a random value, e.g. `openssl rand -base64 32`, in {var} or in a file named by {var}_FILE"


def is_placeholder(value: str) -> bool:
    """True for a known placeholder (case and surrounding blanks ignored)."""
    folded = value.strip().lower()
    return folded in PLACEHOLDERS or folded.startswith(PLACEHOLDER_PREFIXES)


def _secret(settings: Any, name: str) -> str:
    value = getattr(settings, name, None)
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    return value or ""


# Secrets production needs, each with the condition under which it is needed (settings -> bool).
REQUIRED_IN_PRODUCTION: dict[str, Callable[[Any], bool]] = {
    # a ClickHouse server must not be reachable without a password
    "clickhouse_password": lambda s: str(getattr(s, "clickhouse_dsn", "")).startswith(("http://", "https://")),
    # an access key without its secret key cannot sign a request (empty access key: boto3's chain)
    "s3_secret_key": lambda s: getattr(s, "audit_store", "") == "s3" and bool(getattr(s, "s3_access_key", "")),
    # actions that really call the gateway or vLLM admin API must authenticate
    "actions_webhook_token": lambda s: not getattr(s, "actions_dry_run", True)
    and bool(getattr(s, "actions_gateway_url", "") or getattr(s, "actions_vllm_url", "")),
}


def secret_problems(settings: Any, secret_names: list[str], env_prefix: str) -> list[str]:
    """One message per unacceptable secret (empty list: all fine). ``settings.mode`` decides how
    strict: ``production`` also requires the secrets of ``REQUIRED_IN_PRODUCTION`` and a minimum length."""
    production = getattr(settings, "mode", "demo") == "production"
    problems = []
    for name in secret_names:
        var = f"{env_prefix}{name.upper()}"
        value = _secret(settings, name)
        fix = FIX.format(var=var)
        if value and is_placeholder(value):
            problems.append(f"{var} is a placeholder (as in .env.example or a tutorial), not a secret; {fix}")
        elif production and not value and REQUIRED_IN_PRODUCTION.get(name, lambda _s: False)(settings):
            problems.append(f"{var} is empty, and ENTROLOOP_MODE=production needs it; {fix}")
        elif production and value and len(value) < MIN_PRODUCTION_LENGTH:
            problems.append(
                f"{var} is shorter than {MIN_PRODUCTION_LENGTH} characters, too easy to guess for "
                f"ENTROLOOP_MODE=production; {fix}"
            )
    return problems
