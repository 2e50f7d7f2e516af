"""The report's --since/--until: ISO 8601 or durations before now, one SQL condition, one clear error."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest
from typer.testing import CliRunner

from entroloop.cli import app
from entroloop.report.window import ReportWindow, WindowError, parse_moment

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=timezone.utc).timestamp()


@pytest.mark.parametrize(("text", "expected"), [
    ("24h", NOW - 86_400), ("90s", NOW - 90), ("30m", NOW - 1_800), ("7d", NOW - 7 * 86_400), ("2w", NOW - 14 * 86_400),
    ("1.5h", NOW - 5_400), (" 24H ", NOW - 86_400), ("now", NOW),
    ("2026-12-01T09:30:00Z", NOW - 2.5 * 3_600), ("2026-12-01T09:30:00+00:00", NOW - 2.5 * 3_600),
    ("2026-12-01T10:30:00+01:00", NOW - 2.5 * 3_600), ("2026-12-01T09:30:00", NOW - 2.5 * 3_600),  # no zone: UTC
    ("2026-12-01", NOW - 12 * 3_600), ("2026-12-01 11:59:59.5", NOW - 0.5),
])
def test_moments_and_durations(text, expected):
    assert parse_moment(text, "--since", NOW) == pytest.approx(expected)


@pytest.mark.parametrize("text", ["yesterday", "24", "h", "-3h", "2026-13-45", "3x", "24 hours", ""])
def test_unreadable_values_name_the_option_and_the_forms(text):
    with pytest.raises(WindowError) as err:
        parse_moment(text, "--until", NOW)
    message = str(err.value)
    assert message.startswith(f"--until {text!r}") and "ISO 8601" in message and "24h" in message


def test_a_window_that_ends_before_it_starts_is_refused():
    with pytest.raises(WindowError, match=r"^--until .* is not after --since"):
        ReportWindow.parse("1h", "2h", now=NOW)
    with pytest.raises(WindowError):
        ReportWindow.parse("2026-12-01T10:00:00Z", "2026-12-01T10:00:00Z", now=NOW)


def test_window_sql_and_description():
    assert ReportWindow().sql("emitted_at") == "1" and not ReportWindow().bounded
    assert "all stored events" in ReportWindow().describe()
    window = ReportWindow.parse("2026-12-01T10:00:00Z", "1h", now=NOW)
    assert (window.since, window.until) == (NOW - 7_200, NOW - 3_600)
    assert window.sql("at") == (f"at >= toDateTime64({NOW - 7_200:.6f}, 6, 'UTC') AND "
                                f"at < toDateTime64({NOW - 3_600:.6f}, 6, 'UTC')")
    assert window.describe() == "from 2026-12-01 10:00:00 UTC to 2026-12-01 11:00:00 UTC"
    open_end = ReportWindow.parse("24h", None, now=NOW)
    assert open_end.until is None and open_end.describe().endswith("to now")
    assert "<" not in open_end.sql("emitted_at")


@pytest.mark.parametrize(("args", "option"), [
    (["--since", "yesterday"], "--since"), (["--until", "2026-13-45"], "--until"), (["--since", "-3h"], "--since"),
    (["--since", "1h", "--until", "2h"], "--until"),
])
def test_the_command_stops_with_one_line_naming_the_option(tmp_path, args, option):
    out = tmp_path / "r.html"
    result = CliRunner().invoke(app, ["report", "--out", str(out), "--data-dir", str(tmp_path / "none"), *args])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(option), result.output
    assert not out.exists() and not (tmp_path / "none").exists()
