"""The setup page of `looprelay app create` in a real Chromium: one click on its button posts
the manifest to the stand-in for github.com, which redirects back with the code, and the App
is saved."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from tests.cli.test_app_create import AppCreate
from tests.fake_github import FakeGitHub

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

WAIT_SECONDS = 60


def test_one_click_in_a_browser_creates_the_app(
    tmp_path: Path, fake_github: FakeGitHub, browser: WebDriver
) -> None:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    data = tmp_path / "data"
    run = AppCreate(
        data, "--github-url", fake_github.url, "--webhook-url", "https://relay.example/webhook"
    )
    try:
        browser.get(run.page)
        browser.find_element(By.ID, "register").click()
        WebDriverWait(browser, WAIT_SECONDS).until(lambda b: "App created" in b.title)
        code, out, err = run.finish()
    finally:
        run.kill()
    assert code == 0, err
    created = fake_github.created
    assert created is not None
    assert f"https://github.com/apps/{created['slug']}/installations/new" in out
    assert browser.find_element(By.TAG_NAME, "a").get_attribute("href") == (
        f"https://github.com/apps/{created['slug']}/installations/new"
    )
    assert (data / "github-app.yaml").is_file()
