"""`entroloop report` after a demo run: a self-contained page whose every plot renders in headless
Chromium (Debian's `chromium` package)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import pytest

from tests.integration.demo_folder import demo_data_dir, run_module  # noqa: F401 - fixture

INSTALL = "apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends chromium"
EXPECTED_PLOTS = 6


def chromium_binary() -> str:
    found = os.environ.get("ENTROLOOP_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.fail(f"headless Chromium is needed for the report test; install it with `{INSTALL}`", pytrace=False)
    return found


def run_chromium(tmp_path, *args: str) -> subprocess.CompletedProcess[str]:
    profile = tmp_path / f"chromium-profile-{len(list(tmp_path.iterdir()))}"
    profile.mkdir()
    return subprocess.run(
        [chromium_binary(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         f"--user-data-dir={profile}", *args],
        capture_output=True, text=True, timeout=180,
    )


@pytest.fixture(scope="module")
def report_page(demo_data_dir, tmp_path_factory):
    folder, _ = demo_data_dir
    out = tmp_path_factory.mktemp("report") / "report.html"
    proc = run_module("entroloop.cli", "report", "--data-dir", str(folder), "--out", str(out))
    assert proc.stdout.strip().endswith("report.html")
    return out


def test_report_is_self_contained(report_page):
    html = report_page.read_text(encoding="utf-8")
    assert html.count('<svg class="plot"') == EXPECTED_PLOTS
    # nothing to fetch: no external scripts, stylesheets, images or fonts
    assert not re.search(r'(src|href)\s*=\s*["\'](https?:)?//', html)
    assert "@import" not in html and "url(" not in html
    for title in ("Mean token entropy", "Entropy anomalies per request", "Fallback rate by route",
                  "Time to first token", "End-to-end latency by model", "Bad-case funnel"):
        assert title in html
    assert "no token entropy stored" not in html and "no request spans stored" not in html


@pytest.mark.browser
def test_every_plot_renders_in_headless_chromium(report_page, tmp_path):
    proc = run_chromium(tmp_path, "--dump-dom", report_page.as_uri())
    assert proc.returncode == 0, proc.stderr[-2000:]
    dom = proc.stdout
    tally = re.search(r'<meta name="entroloop-plots" content="(\d+)/(\d+)">', dom)
    assert tally, "the page's render check did not run (no entroloop-plots meta in the DOM)"
    assert tally.groups() == (str(EXPECTED_PLOTS), str(EXPECTED_PLOTS)), f"plots rendered: {tally[1]}/{tally[2]}"
    plots = re.findall(r'<svg class="plot"[^>]*>', dom)
    assert len(plots) == EXPECTED_PLOTS
    for tag in plots:
        assert 'data-rendered="true"' in tag, tag
        drawn = int(re.search(r'data-marks-drawn="(\d+)"', tag)[1])
        assert drawn >= 3, tag  # lines/points/bars actually laid out, not an empty frame


@pytest.mark.browser
def test_screenshot_is_painted(report_page, tmp_path):
    shot = tmp_path / "report.png"
    proc = run_chromium(tmp_path, "--window-size=1560,1400", f"--screenshot={shot}", report_page.as_uri())
    assert proc.returncode == 0 and shot.exists(), proc.stderr[-2000:]
    data = shot.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(data) > 50_000  # a blank 1560x1400 page compresses to a few KB
