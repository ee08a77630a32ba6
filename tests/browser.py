"""Headless Chromium for looking at what the project shows a person."""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile

import pytest


def chromium() -> str:
    """The Chromium binary; a missing one skips the test, except in CI where it must be there."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    if os.environ.get("CI") == "true":
        pytest.fail("chromium is missing in CI: .ci/run must install it")
    pytest.skip("chromium is not installed (apt-get install chromium) -- the report is not looked at")


def _chromium(url: str, *args: str, width: int, height: int) -> str:
    with tempfile.TemporaryDirectory() as profile:
        return subprocess.run(
            [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
             f"--window-size={width},{height}", "--virtual-time-budget=10000", *args, url],
            check=True, capture_output=True, timeout=120, text=True,
        ).stdout


def screenshot(url: str, png: str, *, width: int = 1200, height: int = 2400) -> None:
    _chromium(url, f"--screenshot={png}", width=width, height=height)


_MEASURE = """<script>window.addEventListener("load", () => setTimeout(() => {
  const heads = [...document.querySelectorAll("th")].map(th => th.textContent.trim());
  const column = heads.indexOf("reason") + 1;
  const cells = column ? [...document.querySelectorAll(`tbody td:nth-child(${column})`)].map(td => td.getBoundingClientRect().width) : [0];
  document.title = "measured:" + JSON.stringify({scrollWidth: document.documentElement.scrollWidth,
    clientWidth: document.documentElement.clientWidth, reasonWidth: Math.min(...cells, 1e9),
    figures: [...document.querySelectorAll(".js-plotly-plot")].map(f => f.getBoundingClientRect().right)});
}, 500));</script>"""


def measure(html_path: str, *, width: int) -> dict:
    """Lay the page out at ``width`` px in Chromium and return what a person would notice:
    the page's scroll width against the window's, the narrowest reason cell, the figures' right edges."""
    import json
    import re

    with tempfile.TemporaryDirectory() as tmp:
        probe = os.path.join(tmp, os.path.basename(html_path))
        with open(html_path, encoding="utf-8") as f:
            page = f.read()
        with open(probe, "w", encoding="utf-8") as f:
            f.write(page.replace("</body>", _MEASURE + "</body>"))
        dom = _chromium("file://" + probe, "--dump-dom", width=width, height=1000)
    match = re.search(r"<title>measured:(.*?)</title>", dom)
    assert match, "the page never finished loading"
    return json.loads(match.group(1).replace("&quot;", '"'))
