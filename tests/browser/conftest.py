"""A headless Chromium driven by Selenium, from Debian's `chromium` and `chromium-driver`.

Nothing is downloaded at run time: Selenium is pointed at `/usr/bin/chromedriver` (or the one
on PATH) through its ``Service``, so Selenium Manager never looks for a driver or a browser.
When either is missing the browser tests skip, unless ``LOOPRELAY_REQUIRE_BROWSER=1`` (CI),
where they fail. Screenshots go to ``$LOOPRELAY_ARTIFACTS`` or ``test-artifacts/``.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn

import pytest

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

REQUIRE_ENV = "LOOPRELAY_REQUIRE_BROWSER"
ARTIFACTS_ENV = "LOOPRELAY_ARTIFACTS"
ROOT = Path(__file__).resolve().parents[2]
PAGE_LOAD_SECONDS = 30


def _unavailable(what: str) -> NoReturn:
    if os.environ.get(REQUIRE_ENV) == "1":
        pytest.fail(f"{REQUIRE_ENV}=1 but {what}; the browser tests cannot run", pytrace=False)
    pytest.skip(
        f"browser tests skipped: {what} (apt-get install chromium chromium-driver; "
        f"set {REQUIRE_ENV}=1 to fail instead)"
    )


def artifacts_dir() -> Path:
    """Where tests keep what a person looks at afterwards (git-ignored ``test-artifacts/``)."""
    path = Path(os.environ.get(ARTIFACTS_ENV) or ROOT / "test-artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    """A headless Chromium, closed after the test."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if chromium is None or driver_path is None:
        _unavailable("chromium or chromedriver is not installed")
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
    except ImportError:
        _unavailable("the selenium package is not installed (pip install -e '.[test]')")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for argument in (
        "--headless=new",
        "--no-sandbox",  # CI runs as root, where Chromium's sandbox cannot start
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1000",
    ):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(executable_path=driver_path), options=options)
    driver.set_page_load_timeout(PAGE_LOAD_SECONDS)
    yield driver
    driver.quit()
