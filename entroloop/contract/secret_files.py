"""Where secret settings can come from besides environment variables: files.

Environment variables leak: ``docker inspect``, ``/proc/PID/environ``, crash reports and CI logs
show them. Docker secrets, Kubernetes secret volumes and systemd credentials hand a process files
instead, so every secret setting (a ``SecretStr`` field) can also be read from

- ``ENTROLOOP_<NAME>_FILE``: the path of a file holding the value (the convention of the official
  postgres, MySQL and MinIO images); a trailing newline, as editors and ``echo`` leave one, is
  stripped; or
- ``ENTROLOOP_SECRETS_DIR``: a folder of files named like the variables (``ENTROLOOP_<NAME>`` or
  ``entroloop_<name>``, case-insensitive), e.g. ``/run/secrets`` where docker mounts secrets. This
  is pydantic-settings' own ``secrets_dir`` source (it strips surrounding blanks), with errors
  that name the variable.

Precedence: keyword arguments, then ``ENTROLOOP_<NAME>``, then ``ENTROLOOP_<NAME>_FILE``, then the
secrets folder, then the default. Setting both ``ENTROLOOP_<NAME>`` and ``ENTROLOOP_<NAME>_FILE``
is refused: one of them would be silently ignored. A missing, unreadable or empty file is an
error naming the variable; the value itself never appears in a message.
"""

from __future__ import annotations

import os
import typing
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SecretsSettingsSource,
)

FILE_SUFFIX = "_FILE"


class SecretFileError(Exception):
    """A secret file named by a variable is missing, unreadable or empty (the message says which)."""


def is_secret_field(field: FieldInfo) -> bool:
    """True for ``SecretStr`` fields (also ``SecretStr | None``): those are the secrets."""
    annotation = field.annotation
    return annotation is SecretStr or SecretStr in typing.get_args(annotation)


def secret_field_names(settings_cls: type[BaseSettings]) -> list[str]:
    """Secret fields that take ``<NAME>_FILE``: not those with a ``<name>_file`` setting of their own
    (e.g. GATEWAY_API_KEYS_FILE, a key list in its own format, merged with GATEWAY_API_KEYS)."""
    fields = settings_cls.model_fields
    return [name for name, field in fields.items() if is_secret_field(field) and f"{name}_file" not in fields]


def read_secret_file(path: Path, variable: str) -> str:
    """The value in ``path`` without its trailing newline; errors name ``variable`` and the fix."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise SecretFileError(
            f"{variable}: the file {path} does not exist; mount the secret there or point {variable} at it"
        ) from None
    except IsADirectoryError:
        raise SecretFileError(f"{variable}: {path} is a folder, not a file holding the secret") from None
    except PermissionError:
        raise SecretFileError(
            f"{variable}: the file {path} is not readable by this process (uid {os.getuid()}); "
            "make it readable by the service's user (e.g. `chmod 0400` and `chown` to that user)"
        ) from None
    except OSError as exc:
        raise SecretFileError(f"{variable}: cannot read {path}: {exc.strerror}") from None
    try:
        value = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise SecretFileError(f"{variable}: {path} is not UTF-8 text") from None
    value = value.removesuffix("\n").removesuffix("\r")
    if not value.strip():
        raise SecretFileError(f"{variable}: the file {path} is empty; write the secret into it")
    return value


class SecretFileVariablesSource(PydanticBaseSettingsSource):
    """``ENTROLOOP_<NAME>_FILE`` for every secret field: the value is read from that file."""

    def __init__(self, settings_cls: type[BaseSettings], env_prefix: str) -> None:
        super().__init__(settings_cls)
        self.env_prefix = env_prefix

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        # required by the abstract base; __call__ does the work for all fields at once
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for name in secret_field_names(self.settings_cls):
            variable = f"{self.env_prefix}{name.upper()}"
            path = os.environ.get(variable + FILE_SUFFIX, "")
            if not path:
                continue
            if os.environ.get(variable, ""):
                raise SecretFileError(
                    f"{variable} and {variable}{FILE_SUFFIX} are both set; unset one of them "
                    f"(prefer {variable}{FILE_SUFFIX}: files do not leak through the process environment)"
                )
            values[name] = read_secret_file(Path(path), variable + FILE_SUFFIX)
        return values

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(env_prefix={self.env_prefix!r})"


class SecretsDirSource(SecretsSettingsSource):
    """pydantic-settings' ``secrets_dir`` source, folder from ``ENTROLOOP_SECRETS_DIR``, with errors
    that name the variable instead of a warning that is easy to miss."""

    def __init__(self, settings_cls: type[BaseSettings], secrets_dir: Path | None, variable: str) -> None:
        self.variable = variable
        if secrets_dir is not None:
            if not secrets_dir.exists():
                raise SecretFileError(
                    f"{variable}: the folder {secrets_dir} does not exist; mount the secrets there or unset {variable}"
                )
            if not secrets_dir.is_dir():
                raise SecretFileError(f"{variable}: {secrets_dir} is not a folder")
            if not os.access(secrets_dir, os.R_OK | os.X_OK):
                raise SecretFileError(f"{variable}: the folder {secrets_dir} is not readable by this process")
        super().__init__(settings_cls, secrets_dir=secrets_dir)

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        try:
            value, key, complex_ = super().get_field_value(field, field_name)
        except OSError as exc:
            raise SecretFileError(
                f"{self.variable}: cannot read the file for {field_name.upper()} in {self.secrets_dir}: {exc.strerror}"
            ) from None
        if value is not None and is_secret_field(field) and not value:
            raise SecretFileError(
                f"{self.variable}: the file for {field_name.upper()} in {self.secrets_dir} is empty; write the secret into it"
            )
        return value, key, complex_
