"""`entroloop worker` / `entroloop fleet`: registration, broker parsing, a clear error without a broker."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from entroloop.cli import app
from entroloop.cli.distributed import broker_address


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("127.0.0.1:9092", "127.0.0.1:9092"),
        ("kafka://h1:9092", "h1:9092"),
        ("kafka://h1:9092, kafka://h2:9093", "h1:9092,h2:9093"),
    ],
)
def test_broker_address(given: str, expected: str) -> None:
    assert broker_address(given) == expected


@pytest.mark.parametrize("command", ["worker", "fleet"])
def test_commands_exist_and_need_a_broker(command: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ENTROLOOP_KAFKA_BOOTSTRAP", raising=False)
    result = CliRunner().invoke(app, [command])
    assert result.exit_code == 2
    assert "ENTROLOOP_KAFKA_BOOTSTRAP" in result.output
