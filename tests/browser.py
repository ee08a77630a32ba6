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


def screenshot(url: str, png: str, *, width: int = 1200, height: int = 2400) -> None:
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run(
            [chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}",
             f"--window-size={width},{height}", "--virtual-time-budget=10000", f"--screenshot={png}", url],
            check=True, capture_output=True, timeout=120,
        )
