"""The report of a (synthetic) profile opens in headless Chromium with no console errors and
every figure rendered at a non-zero size; a screenshot is saved.

The page itself has no JavaScript. To read the rendered image sizes back, the test loads a
copy with a small inline probe script (and a CSP that allows it) that writes each <img>'s
naturalWidth x naturalHeight into a data attribute, then reads the DOM with --dump-dom.
Console errors are read from Chromium's log on stderr for the unmodified page; a control
page with a deliberate console.error proves that the log would show one. Skipped when no
Chromium is installed (Debian: apt-get install chromium)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from rlbatch.analysis.figures import FIGURES
from rlbatch.report.build import build_report
from rlbatch.report.html import CSP, esc
from test_report_figures import write_profile

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--disable-dev-shm-usage"]
PROBE = """<script>
window.addEventListener('load', function () {
  var imgs = document.querySelectorAll('img');
  for (var i = 0; i < imgs.length; i++) {
    imgs[i].setAttribute('data-natural', imgs[i].naturalWidth + 'x' + imgs[i].naturalHeight);
  }
  document.body.setAttribute('data-probe', String(imgs.length));
});
</script>
"""
CONSOLE_ERROR = re.compile(r"CONSOLE.*(error|uncaught)|Refused to|Failed to load resource|"
                           r"net::ERR_", re.IGNORECASE)


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None


CHROMIUM = find_chromium()
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no Chromium on PATH or at "
                                "/usr/bin/chromium (Debian: apt-get install chromium)")


def chromium(page: Path, profile_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = [CHROMIUM, *FLAGS, f"--user-data-dir={profile_dir}", *extra, page.as_uri()]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)


def console_errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if CONSOLE_ERROR.search(line)]


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "fsync", lambda fd: None)  # speed only
        root = tmp_path_factory.mktemp("browser")
        out = root / "report.html"
        result = build_report([str(write_profile(root / "profile"))], out)
    assert result["omitted"] == {}
    return out


def test_console_log_would_show_an_error(tmp_path):
    control = tmp_path / "control.html"
    control.write_text("<!DOCTYPE html><html><body><p>x</p>"
                       "<script>console.error('rlbatch-control-error')</script></body></html>")
    proc = chromium(control, tmp_path / "ud", "--enable-logging=stderr", "--v=0", "--dump-dom")
    assert "rlbatch-control-error" in proc.stderr, proc.stderr[-2000:]
    assert console_errors(proc.stderr)


def test_report_renders_without_console_errors_and_saves_a_screenshot(report, tmp_path):
    shot = tmp_path / "report.png"
    proc = chromium(report, tmp_path / "ud", "--enable-logging=stderr", "--v=0",
                    "--window-size=1280,7000", "--hide-scrollbars", f"--screenshot={shot}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert console_errors(proc.stderr) == [], proc.stderr[-2000:]
    assert shot.read_bytes().startswith(b"\x89PNG") and shot.stat().st_size > 50_000
    keep = os.environ.get("RLBATCH_REPORT_SCREENSHOT")
    if keep:
        shutil.copy(shot, keep)


def test_every_figure_has_a_non_zero_rendered_size(report, tmp_path):
    probe_csp = CSP + "; script-src 'unsafe-inline'"
    page = report.read_text().replace(esc(CSP), esc(probe_csp), 1)
    page = page.replace("</body>", PROBE + "</body>")
    probe = tmp_path / "probe.html"
    probe.write_text(page)
    proc = chromium(probe, tmp_path / "ud", "--virtual-time-budget=10000", "--dump-dom")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f'data-probe="{len(FIGURES)}"' in proc.stdout, proc.stdout[-2000:]
    sizes = {}
    for tag in re.findall(r"<img [^>]*>", proc.stdout):
        key = re.search(r'data-figure="([a-z_]+)"', tag).group(1)
        w, h = re.search(r'data-natural="(\d+)x(\d+)"', tag).groups()
        sizes[key] = (int(w), int(h))
    assert set(sizes) == set(FIGURES)
    assert all(w > 100 and h > 100 for w, h in sizes.values()), sizes
