"""The status page in a real browser, against a live `looprelay up` with a registered runner
agent holding real tmux sessions (the fake harness stands in for `claude`).

What an operator does: open `/status`, find the runner live, each work item's session on it,
and copy the attach command; that command names a session tmux really has. A screenshot of the
page is kept as a test artifact.
"""

from __future__ import annotations

import signal
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
        seen.add(work_item.split(" ")[0])
    assert seen == {f"github:{REPO}#{n}" for n in WORK_ITEMS}
    outcomes = browser.find_elements(
        By.CSS_SELECTOR, "#deliveries tr[data-delivery] td:nth-child(4)"
    )
    assert {o.text for o in outcomes} == {"dispatched", "ignored"}

    screenshot = artifacts_dir() / "status-page.png"
    assert browser.save_screenshot(str(screenshot))
    assert screenshot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
