"""Secrets from files, placeholders refused, values never printed (issue 12, finding 8).

Deployment secrets used to come only from environment variables, and the ``change-me-*``
passwords of ``.env.example`` passed every check. These tests go through ``load_settings`` and
the real ``entroloop`` CLI, as a service does.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from typer.testing import CliRunner

from entroloop.contract.settings import Settings, SettingsError, load_settings

SECRET = "Zq3r7Fh2-not-a-placeholder-9Kd"


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No ENTROLOOP_* variable of the developer's shell (or of .services.env) leaks into a test."""
    for name in list(os.environ):
        if name.startswith("ENTROLOOP_"):
            monkeypatch.delenv(name)


def secret_fields() -> list[str]:
    """Secret settings; those with a `<name>_file` setting of their own (GATEWAY_API_KEYS_FILE, a key
    list in its own format) keep that meaning."""
    from pydantic import SecretStr

    fields = Settings.model_fields
    return [n for n, f in fields.items() if f.annotation is SecretStr and f"{n}_file" not in fields]


# --- secrets from files --------------------------------------------------------------------------


def test_every_secret_can_come_from_a_file_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    names = secret_fields()
    assert {"clickhouse_password", "s3_secret_key", "pii_hash_key", "actions_webhook_token"} <= set(names)
    for name in names:
        path = tmp_path / name
        path.write_text(f"{SECRET}-{name}\n")  # editors and `echo` leave a trailing newline
        monkeypatch.setenv(f"ENTROLOOP_{name.upper()}_FILE", str(path))
    loaded = load_settings()
    for name in names:
        assert getattr(loaded, name).get_secret_value() == f"{SECRET}-{name}", name


def test_secrets_dir_as_docker_mounts_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = tmp_path / "run-secrets"
    secrets.mkdir()
    (secrets / "ENTROLOOP_CLICKHOUSE_PASSWORD").write_text(SECRET + "\n")
    (secrets / "entroloop_s3_secret_key").write_text(SECRET + "-s3")  # lower case works too
    monkeypatch.setenv("ENTROLOOP_SECRETS_DIR", str(secrets))
    loaded = load_settings()
    assert loaded.clickhouse_password.get_secret_value() == SECRET
    assert loaded.s3_secret_key.get_secret_value() == SECRET + "-s3"


def test_precedence_variable_then_file_then_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "ENTROLOOP_PII_HASH_KEY").write_text(SECRET + "-dir")
    (tmp_path / "key").write_text(SECRET + "-file")
    monkeypatch.setenv("ENTROLOOP_SECRETS_DIR", str(secrets))
    assert load_settings().pii_hash_key.get_secret_value() == SECRET + "-dir"
    monkeypatch.setenv("ENTROLOOP_PII_HASH_KEY_FILE", str(tmp_path / "key"))
    assert load_settings().pii_hash_key.get_secret_value() == SECRET + "-file"
    # an empty variable (docker compose's `${X:-}`) does not hide the file
    monkeypatch.setenv("ENTROLOOP_PII_HASH_KEY", "")
    assert load_settings().pii_hash_key.get_secret_value() == SECRET + "-file"


def test_variable_and_file_together_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pw").write_text(SECRET)
    monkeypatch.setenv("ENTROLOOP_CLICKHOUSE_PASSWORD", SECRET + "-env")
    monkeypatch.setenv("ENTROLOOP_CLICKHOUSE_PASSWORD_FILE", str(tmp_path / "pw"))
    with pytest.raises(SettingsError, match="ENTROLOOP_CLICKHOUSE_PASSWORD and ENTROLOOP_CLICKHOUSE_PASSWORD_FILE"):
        load_settings()


def test_missing_file_names_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENTROLOOP_S3_SECRET_KEY_FILE", str(tmp_path / "nope"))
    with pytest.raises(SettingsError, match=r"ENTROLOOP_S3_SECRET_KEY_FILE: the file .*nope does not exist"):
        load_settings()


def test_empty_file_names_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "empty").write_text("\n")
    monkeypatch.setenv("ENTROLOOP_PII_HASH_KEY_FILE", str(tmp_path / "empty"))
    with pytest.raises(SettingsError, match="ENTROLOOP_PII_HASH_KEY_FILE: .* is empty"):
        load_settings()


def test_unreadable_file_names_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "locked"
    path.write_text(SECRET)
    path.chmod(0)
    if os.geteuid() == 0:  # root reads files whatever their mode (CI runs as root): refuse the read
        real_read_bytes = Path.read_bytes

        def refuse(self: Path) -> bytes:
            if self == path:
                raise PermissionError(13, "Permission denied", str(self))
            return real_read_bytes(self)

        monkeypatch.setattr(Path, "read_bytes", refuse)
    monkeypatch.setenv("ENTROLOOP_CLICKHOUSE_PASSWORD_FILE", str(path))
    with pytest.raises(SettingsError, match="ENTROLOOP_CLICKHOUSE_PASSWORD_FILE: .* not readable"):
        load_settings()


def test_file_that_is_a_folder_names_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # also runs as root: the unreadable-file case above cannot
    monkeypatch.setenv("ENTROLOOP_CLICKHOUSE_PASSWORD_FILE", str(tmp_path))
    with pytest.raises(SettingsError, match="ENTROLOOP_CLICKHOUSE_PASSWORD_FILE: .* is a folder"):
        load_settings()


def test_missing_secrets_dir_names_the_variable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENTROLOOP_SECRETS_DIR", str(tmp_path / "not-mounted"))
    with pytest.raises(SettingsError, match="ENTROLOOP_SECRETS_DIR: the folder .*not-mounted does not exist"):
        load_settings()


# --- placeholders and production ------------------------------------------------------------------


def env_example_placeholders() -> dict[str, str]:
    """The ENTROLOOP_* secrets of .env.example as shipped before the fix (`change-me-*`)."""
    return {"ENTROLOOP_PII_HASH_KEY": "change-me-pii-hash-key", "ENTROLOOP_CLICKHOUSE_PASSWORD": "change-me-clickhouse"}


@pytest.mark.parametrize("value", ["change-me-clickhouse", "changeme", "CHANGE_ME", "password", "minioadmin",
                                   " Password ", "your-secret-here"])
def test_placeholder_secrets_are_refused_in_every_mode(value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENTROLOOP_CLICKHOUSE_PASSWORD", value)
    with pytest.raises(SettingsError) as caught:
        load_settings()
    message = str(caught.value)
    assert "ENTROLOOP_CLICKHOUSE_PASSWORD is a placeholder" in message
    assert "openssl rand" in message and "ENTROLOOP_CLICKHOUSE_PASSWORD_FILE" in message  # the fix
    assert value.strip() not in message


def test_env_example_secrets_do_not_pass(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in env_example_placeholders().items():
        monkeypatch.setenv(name, value)
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert "ENTROLOOP_PII_HASH_KEY" in str(caught.value) and "ENTROLOOP_CLICKHOUSE_PASSWORD" in str(caught.value)


def test_placeholder_from_a_file_is_refused_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "key").write_text("change-me-pii-hash-key\n")
    monkeypatch.setenv("ENTROLOOP_PII_HASH_KEY_FILE", str(tmp_path / "key"))
    with pytest.raises(SettingsError, match="ENTROLOOP_PII_HASH_KEY is a placeholder"):
        load_settings()


def test_production_requires_the_server_password(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENTROLOOP_CLICKHOUSE_DSN", "http://clickhouse:8123")
    load_settings()  # demo mode: an unprotected local server is the user's choice
    monkeypatch.setenv("ENTROLOOP_MODE", "production")
    with pytest.raises(SettingsError, match="ENTROLOOP_CLICKHOUSE_PASSWORD is empty, and ENTROLOOP_MODE=production"):
        load_settings()
    monkeypatch.setenv("ENTROLOOP_CLICKHOUSE_PASSWORD", "short-pw")
    with pytest.raises(SettingsError, match="ENTROLOOP_CLICKHOUSE_PASSWORD is shorter than 16"):
        load_settings()
    monkeypatch.setenv("ENTROLOOP_CLICKHOUSE_PASSWORD", SECRET)
    monkeypatch.setenv("ENTROLOOP_PII_HASH_KEY", SECRET + "-pii")
    assert load_settings().mode == "production"


def test_production_requires_the_s3_secret_with_an_access_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENTROLOOP_MODE", "production")
    monkeypatch.setenv("ENTROLOOP_PII_HASH_KEY", SECRET + "-pii")
    monkeypatch.setenv("ENTROLOOP_AUDIT_STORE", "s3")
    load_settings()  # no access key: boto3's credential chain (instance role, ~/.aws)
    monkeypatch.setenv("ENTROLOOP_S3_ACCESS_KEY", "audit-writer")
    with pytest.raises(SettingsError, match="ENTROLOOP_S3_SECRET_KEY is empty"):
        load_settings()


def test_mode_must_be_known(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENTROLOOP_MODE", "prod")
    with pytest.raises(SettingsError, match="ENTROLOOP_MODE"):
        load_settings()


# --- never printed ---------------------------------------------------------------------------------


def test_settings_command_masks_secrets_from_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from entroloop.cli import app

    (tmp_path / "pw").write_text(SECRET + "\n")
    (tmp_path / "pw").chmod(stat.S_IRUSR)
    monkeypatch.setenv("ENTROLOOP_CLICKHOUSE_PASSWORD_FILE", str(tmp_path / "pw"))
    monkeypatch.setenv("ENTROLOOP_DATA_DIR", str(tmp_path / "data"))
    result = CliRunner().invoke(app, ["settings"])
    assert result.exit_code == 0, result.output
    assert "ENTROLOOP_CLICKHOUSE_PASSWORD=**********" in result.output
    assert SECRET not in result.output


def test_refusal_exits_2_without_the_value(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from entroloop.cli import app

    monkeypatch.setenv("ENTROLOOP_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("ENTROLOOP_S3_SECRET_KEY", "minioadmin")
    result = CliRunner().invoke(app, ["settings"])
    assert result.exit_code == 2
    assert "ENTROLOOP_S3_SECRET_KEY is a placeholder" in result.output


def test_a_secret_failing_validation_is_not_echoed(monkeypatch: pytest.MonkeyPatch) -> None:
    # a secret next to a bad value: the error lists the bad value's variable, never a secret
    monkeypatch.setenv("ENTROLOOP_CLICKHOUSE_PASSWORD", SECRET)
    monkeypatch.setenv("ENTROLOOP_PARTITIONS", "zero")
    with pytest.raises(SettingsError) as caught:
        load_settings()
    assert "ENTROLOOP_PARTITIONS" in str(caught.value) and SECRET not in str(caught.value)
