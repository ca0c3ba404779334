"""The status page in a real browser, against a live `looprelay up` with a registered runner
agent holding real tmux sessions (the fake harness stands in for `claude`).

What an operator does: open `/status`, find the runner live, each work item's session on it,
and copy the attach command; that command names a session tmux really has. A screenshot of the
page is kept as a test artifact.
"""

from __future__ import annotations

import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import requests

from tests.browser.conftest import artifacts_dir
from tests.fake_harness import FakeHarness, wait_until
from tests.faults.runners import (
    DEADLINE,
    REPO,
    Runner,
    Stack,
    kill_tmux,
    register_runner,
    socket_name,
    start_stack,
    start_work_items,
)

if TYPE_CHECKING:
    from selenium.webdriver.remote.webdriver import WebDriver

__all__ = ["socket_name"]  # the fixture, imported for pytest

CONFIG = """\
routing:
  authorizedUsers: [codertocat]
runners:
  pollWaitSeconds: 1
  heartbeatSeconds: 5
"""
WORK_ITEMS = (1, 2)


@pytest.fixture
def stack(tmp_path: Path, fake_harness: FakeHarness) -> Iterator[Stack]:
    started = start_stack(tmp_path, CONFIG)
    yield started
    started.close()
    started.up.stop(signal.SIGKILL)


@pytest.fixture
def runner(stack: Stack, tmp_path: Path, socket_name: str) -> Iterator[Runner]:
    box = register_runner(stack, tmp_path, "box", socket_name=socket_name, capacity=2)
    box.start()
    yield box
    box.kill()
    kill_tmux(socket_name)


def _live_sessions(stack: Stack) -> list[dict[str, Any]] | None:
    view = requests.get(
        f"{stack.server}/status", headers={"Accept": "application/json"}, timeout=10
    ).json()
    live = [s for s in view["sessions"] if s["state"] == "live" and s["attach"]]
    return live if len(live) == len(WORK_ITEMS) else None


def test_the_page_shows_the_runner_its_sessions_and_working_attach_commands(
    stack: Stack, runner: Runner, browser: WebDriver
) -> None:
    from selenium.webdriver.common.by import By

    start_work_items(stack, WORK_ITEMS)
    wait_until(lambda: _live_sessions(stack), seconds=DEADLINE, what="two live sessions")

    browser.get(f"{stack.server}/status")

    assert browser.title == "looprelay status"
    [runner_row] = browser.find_elements(By.CSS_SELECTOR, "#runners tr[data-runner]")
    cells = [cell.text for cell in runner_row.find_elements(By.TAG_NAME, "td")]
    assert cells[:3] == ["box", runner.runner_id, "live"]
    rows = browser.find_elements(By.CSS_SELECTOR, "#sessions tr[data-session]")
    assert len(rows) == len(WORK_ITEMS)
    seen = set()
    for row in rows:
        session = row.get_attribute("data-session") or ""
        work_item = row.find_element(By.TAG_NAME, "td").text
        attach = row.find_element(By.CSS_SELECTOR, "code.attach").text
        assert attach == f"tmux -L {runner.socket_name} attach -t {session}"
        # The command an operator copies names a session this runner's tmux really has.
        exists = subprocess.run(
            ["tmux", "-L", runner.socket_name, "has-session", "-t", f"={session}"], check=False
        )
        assert exists.returncode == 0, f"{attach}: no such session"
        ref = work_item.split(" ")[0]
        seen.add(ref)
        # The work item links to its issue on GitHub; the session says what it last did.
        link = row.find_element(By.CSS_SELECTOR, "td a").get_attribute("href")
        assert link == f"https://github.com/{REPO}/issues/{ref.split('#')[1]}"
        assert row.find_element(By.CSS_SELECTOR, "td.activity").text.startswith(
            ("pasted ", "spawned ", "starting ")
        )
    assert seen == {f"github:{REPO}#{n}" for n in WORK_ITEMS}
    assert runner_row.find_element(By.CSS_SELECTOR, "td.host").text == socket.gethostname()
    outcomes = browser.find_elements(
        By.CSS_SELECTOR, "#deliveries tr[data-delivery] td:nth-child(4)"
    )
    assert {o.get_attribute("textContent") for o in outcomes} == {"dispatched", "ignored"}
    _screenshot(browser, "status-page.png")

    # A copy button puts its attach command on the clipboard (reading it back needs leave).
    browser.execute_cdp_cmd(  # type: ignore[attr-defined]
        "Browser.grantPermissions",
        {"origin": stack.server, "permissions": ["clipboardReadWrite", "clipboardSanitizedWrite"]},
    )
    button = rows[0].find_element(By.CSS_SELECTOR, "button.copy")
    command = button.get_attribute("data-copy")
    button.click()
    wait_until(lambda: button.text == "copied", seconds=DEADLINE, what="the copy button")
    assert browser.execute_async_script(_READ_CLIPBOARD) == command

    # Each delivery opens its own page, listing the events it caused.
    first = browser.find_element(By.CSS_SELECTOR, "#deliveries details[open] tr[data-delivery] a")
    delivery_id = first.text
    first.click()
    assert browser.current_url.endswith(f"/status/deliveries/{delivery_id}")
    assert browser.find_elements(By.CSS_SELECTOR, "#events tr[data-event]")
    _screenshot(browser, "status-delivery.png")


@pytest.mark.parametrize(("width", "name"), [(1400, "desktop"), (390, "phone")])
def test_nothing_is_wider_than_the_window_at_desktop_and_phone_widths(
    stack: Stack, runner: Runner, browser: WebDriver, width: int, name: str
) -> None:
    from selenium.webdriver.common.by import By

    start_work_items(stack, WORK_ITEMS)
    wait_until(lambda: _live_sessions(stack), seconds=DEADLINE, what="two live sessions")
    browser.set_window_size(width, 900)
    browser.get(f"{stack.server}/status")
    wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, "#sessions tr[data-session]"))
    # The State and Attach of every session are on screen: every element within the width.
    viewport = browser.execute_script("return document.documentElement.clientWidth")
    assert viewport <= width
    _assert_fits(browser, viewport, name)
    _screenshot(browser, f"status-page-{name}.png")
    # A delivery's page, with its events' fields, fits too.
    link = browser.find_element(By.CSS_SELECTOR, "#deliveries details[open] tr[data-delivery] a")
    browser.get(link.get_attribute("href") or "")
    wait_until(lambda: browser.find_elements(By.CSS_SELECTOR, "#events tr[data-event]"))
    _assert_fits(browser, viewport, f"{name} (a delivery)")
    _screenshot(browser, f"status-delivery-{name}.png")


def _assert_fits(browser: WebDriver, viewport: int, name: str) -> None:
    wide = browser.execute_script(_WIDER_THAN, viewport)
    assert wide == [], f"wider than the {viewport}px window at {name} width: {wide}"
    assert browser.execute_script("return document.documentElement.scrollWidth") <= viewport


_WIDER_THAN = """
const limit = arguments[0];
return Array.from(document.querySelectorAll("body *"))
  .filter(e => {
    const r = e.getBoundingClientRect();
    return r.width > 0 && r.right > limit + 0.5;
  })
  .map(e => e.tagName + "." + e.className + " " + Math.round(e.getBoundingClientRect().right))
  .slice(0, 10);
"""
_READ_CLIPBOARD = """
const done = arguments[arguments.length - 1];
navigator.clipboard.readText().then(done, error => done("unreadable: " + error));
"""


def _screenshot(browser: WebDriver, name: str) -> None:
    screenshot = artifacts_dir() / name
    assert browser.save_screenshot(str(screenshot))
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
