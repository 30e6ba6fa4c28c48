"""One headless Chromium for the browser tests (Debian's chromium and chromedriver, which .ci/run
installs): skipped where the machine lacks them, a failure in CI."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest


def headless_chromium(profile: Path, size: str) -> Any:
    """A Selenium driver of a fresh headless Chromium, its profile in `profile`, its window `size`
    ("W,H"). The caller quits it."""
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not browser or not driver:
        if os.environ.get("CI"):
            pytest.fail("CI must install Debian's chromium and chromium-driver (.ci/run does)")
        pytest.skip("no chromium/chromedriver here; `apt-get install chromium chromium-driver`")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        f"--window-size={size}",
    ):
        opts.add_argument(flag)
    return webdriver.Chrome(service=Service(executable_path=driver), options=opts)
