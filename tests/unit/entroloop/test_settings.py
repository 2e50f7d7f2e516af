from pathlib import Path

import pytest

from entroloop.contract.settings import (
    Settings,
    SettingsError,
    load_settings,
    settings_markdown,
)


def test_every_setting_is_documented():
    for name, field in Settings.model_fields.items():
        assert field.description, f"ENTROLOOP_{name.upper()} has no description"


def test_configuration_page_lists_every_variable():
    page = (Path(__file__).parents[3] / "docs" / "configuration.md").read_text()
    missing = [f"ENTROLOOP_{n.upper()}" for n in Settings.model_fields if f"ENTROLOOP_{n.upper()}" not in page]
    assert not missing, f"docs/configuration.md does not document {missing}; run `make readme-settings`"


def test_config_error_names_the_variable(monkeypatch):
    monkeypatch.setenv("ENTROLOOP_PARTITIONS", "zero")
    with pytest.raises(SettingsError, match="ENTROLOOP_PARTITIONS"):
        load_settings()


def test_bad_dsn_names_the_fix(monkeypatch):
    monkeypatch.setenv("ENTROLOOP_CLICKHOUSE_DSN", "clickhouse://x")
    with pytest.raises(SettingsError, match="chdb://"):
        load_settings()


def test_secrets_never_print(monkeypatch):
    monkeypatch.setenv("ENTROLOOP_CLICKHOUSE_PASSWORD", "hunter2")
    s = load_settings()
    assert "hunter2" not in repr(s) and "hunter2" not in str(s.model_dump())
    assert s.clickhouse_password.get_secret_value() == "hunter2"


def test_markdown_table_has_a_row_per_setting():
    table = settings_markdown()
    assert table.count("| `ENTROLOOP_") == len(Settings.model_fields)
