"""`entroloop report` after a demo run: a self-contained page whose every plot renders in headless
Chromium (Debian's `chromium` package), laid out in two columns on a desktop and one on a phone
without sideways scrolling, with visible section titles; `--since/--until` narrow every section.

The screenshots stay under the pytest tmp dir (``report-screenshots*``) as artefacts of the run.
"""

from __future__ import annotations

import base64
import json
import re
from datetime import datetime, timezone
from html import escape

import pytest

from tests.integration.chromium import DevTools, dump_dom
from tests.integration.demo_folder import demo_data_dir, run_module  # noqa: F401 - fixture

EXPECTED_PLOTS = 9
PLOT_TITLES = ("Mean token entropy by model", "Entropy distribution per request", "Entropy anomalies per request",
               "Fallback rate by route", "Time to first token p50 / p95 / p99", "Time per output token p50 / p95",
               "Request time by stage (median)", "End-to-end latency by model", "Bad-case funnel")
SECTION_TITLES = (*PLOT_TITLES, "Intent similarity by language and route", "Latency breakdown by stage", "Bad cases",
                  "Latest alerts", "Adapters", "Highest-entropy requests", "Alert actions", "Dead letters",
                  "Rows in the window")
AXIS_TITLES = ("entropy (nats)", "mean entropy of the request (nats)", "share of the model's requests", "time (UTC)",
               "time per output token", "seconds (median of each stage)")
DESKTOP, PHONE = (1440, 1800), (390, 1600)

# Run in the page by the test over the DevTools protocol: what a person would see, measured by the
# browser's own layout.
LAYOUT_PROBE = """(() => {
  const root = document.documentElement, lefts = new Set();
  document.querySelectorAll('.card').forEach(c => lefts.add(Math.round(c.getBoundingClientRect().left)));
  const titles = [...document.querySelectorAll('h1, h2')].map(h => {
    const r = h.getBoundingClientRect(), s = getComputedStyle(h);
    return {text: h.textContent, visible: r.width > 0 && r.height > 0 && s.visibility === 'visible'
            && s.display !== 'none' && parseFloat(s.fontSize) >= 12 && r.left >= 0 && r.right <= root.clientWidth + 0.5};
  });
  return {innerWidth, clientWidth: root.clientWidth, scrollWidth: root.scrollWidth,
          bodyScrollWidth: document.body.scrollWidth, columns: lefts.size, titles};
})()"""

# Decodes a screenshot with the browser's own PNG decoder and counts what is painted: colours, the
# share of pixels that are not the background, and that share in the left and right halves.
PIXEL_PROBE = """(async () => {
  const img = new Image(); img.src = 'data:image/png;base64,{png}'; await img.decode();
  const c = document.createElement('canvas'); c.width = img.naturalWidth; c.height = img.naturalHeight;
  const g = c.getContext('2d'); g.drawImage(img, 0, 0);
  const d = g.getImageData(0, 0, c.width, c.height).data, counts = new Map(), key = i => (d[i] >> 3) * 1024 + (d[i + 1] >> 3) * 32 + (d[i + 2] >> 3);
  for (let i = 0; i < d.length; i += 4) counts.set(key(i), (counts.get(key(i)) || 0) + 1);
  let bg = null, top = 0; counts.forEach((n, k) => { if (n > top) { top = n; bg = k; } });
  const ink = [0, 0], n = c.width * c.height;
  for (let y = 0; y < c.height; y++) for (let x = 0; x < c.width; x++)
    if (key((y * c.width + x) * 4) !== bg) ink[x < c.width / 2 ? 0 : 1]++;
  return {width: c.width, height: c.height, colours: counts.size, ink: (ink[0] + ink[1]) / n,
          left: ink[0] / (n / 2), right: ink[1] / (n / 2)};
})()"""


@pytest.fixture(scope="module")
def report_page(demo_data_dir, tmp_path_factory):
    folder, _ = demo_data_dir
    out = tmp_path_factory.mktemp("report") / "report.html"
    proc = run_module("entroloop.cli", "report", "--data-dir", str(folder), "--out", str(out), "--json")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["report"] == str(out.resolve()) and summary["since"] is None and summary["until"] is None
    return out, summary


@pytest.fixture(scope="module")
def screenshots(tmp_path_factory):
    """Where the screenshots are kept after the run (pytest keeps the last runs' tmp dirs)."""
    return tmp_path_factory.mktemp("report-screenshots")


def test_report_is_self_contained_with_titles_and_units(report_page):
    html = report_page[0].read_text(encoding="utf-8")
    assert html.count('<svg class="plot"') == EXPECTED_PLOTS
    # nothing to fetch: no external scripts, stylesheets, images or fonts
    assert not re.search(r'(src|href)\s*=\s*["\'](https?:)?//', html)
    assert "@import" not in html and "url(" not in html
    headings = re.findall(r"<h2>(.*?)</h2>", html)
    for title in SECTION_TITLES:
        assert any(h.startswith(title) for h in headings), title
    for axis in AXIS_TITLES:
        assert f">{escape(axis)}</text>" in html, axis
    assert "no token entropy stored" not in html and "no llm_request span" not in html
    assert "Window:</b> all stored events" in html


@pytest.mark.browser
def test_every_plot_renders_in_headless_chromium(report_page, tmp_path):
    dom = dump_dom(tmp_path, report_page[0])
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
@pytest.mark.parametrize(("name", "size", "columns"), [("desktop", DESKTOP, 2), ("phone", PHONE, 1)])
def test_layout_and_screenshot(report_page, screenshots, tmp_path, name, size, columns):
    width, height = size
    shot = screenshots / f"report-{name}-{width}px.png"
    with DevTools(tmp_path) as browser:
        browser.open(report_page[0], width, height, mobile=name == "phone")
        layout = browser.evaluate(LAYOUT_PROBE)
        png = browser.screenshot(shot)
        pixels = browser.evaluate(PIXEL_PROBE.replace("{png}", base64.b64encode(png).decode()))
    assert layout["innerWidth"] == width, layout
    # no sideways scrolling: the page is no wider than the window (wide tables scroll inside their card)
    assert layout["scrollWidth"] <= layout["clientWidth"] and layout["bodyScrollWidth"] <= layout["clientWidth"], layout
    assert layout["columns"] == columns, layout
    visible = [t["text"] for t in layout["titles"] if t["visible"]]
    for title in SECTION_TITLES:
        assert any(v.startswith(title) for v in visible), f"{title!r} is not visible text at {width} px: {layout['titles']}"

    assert png[:8] == b"\x89PNG\r\n\x1a\n" and (pixels["width"], pixels["height"]) == (width, height), pixels
    # painted: many colours (lines, bars, text) and a real share of non-background pixels
    assert pixels["colours"] >= 40 and pixels["ink"] >= 0.08, f"{shot} looks blank: {pixels}"
    if columns == 2:  # both halves carry charts
        assert pixels["left"] >= 0.05 and pixels["right"] >= 0.05, f"{shot}: one column is empty: {pixels}"


def test_since_until_narrow_every_section_and_show_in_the_header(report_page, demo_data_dir, tmp_path):
    folder, _ = demo_data_dir
    full = report_page[1]["rows"]
    first = report_page[1]["start"]
    since = datetime.fromtimestamp(first + 10, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    until = datetime.fromtimestamp(first + 20, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S+00:00")
    out = tmp_path / "window.html"
    proc = run_module("entroloop.cli", "report", "--data-dir", str(folder), "--out", str(out), "--json",
                      "--since", since, "--until", until)
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["since"] == pytest.approx(int(first) + 10, abs=1) and summary["until"] - summary["since"] == 10
    rows = summary["rows"]
    for table in ("token_entropy", "spans", "audit_index", "feedback", "alerts", "bad_cases"):
        assert 0 < rows[table] < full[table], (table, rows[table], full[table])
    assert first + 10 - 1 <= summary["start"] and summary["end"] < first + 20
    html = out.read_text(encoding="utf-8")
    shown = datetime.fromtimestamp(summary["since"], tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")
    assert f"Window:</b> from {shown} to " in html

    # a relative window ending before the demo's events (they are days old): every section empty
    empty = tmp_path / "empty.html"
    proc = run_module("entroloop.cli", "report", "--data-dir", str(folder), "--out", str(empty), "--json",
                      "--since", "1h")
    rows = json.loads(proc.stdout.strip().splitlines()[-1])["rows"]
    assert not any(rows[t] for t in ("token_entropy", "spans", "audit_index", "feedback", "alerts", "bad_cases"))
    assert "no token entropy stored in the window" in empty.read_text(encoding="utf-8")


def test_the_distribution_marks_the_configured_thresholds(demo_data_dir, tmp_path):
    import os
    import subprocess
    import sys

    from tests.integration.demo_folder import REPO_ROOT

    folder, _ = demo_data_dir
    out = tmp_path / "thresholds.html"
    env = {**os.environ, "ENTROLOOP_LOOP_THRESHOLD_NATS": "2.25", "ENTROLOOP_GIBBERISH_THRESHOLD_NATS": "6.5"}
    proc = subprocess.run([sys.executable, "-m", "entroloop.cli", "report", "--data-dir", str(folder), "--out", str(out)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    html = out.read_text(encoding="utf-8")
    assert ">loop &lt; 2.25</text>" in html and ">gibberish &gt; 6.5</text>" in html
