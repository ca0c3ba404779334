"""`looprelay up` with `github.poll.repositories` and no webhook at all: as an operator without
a public URL runs it. The fake GitHub serves the listings (tests/fake_github_poll.py); a label
and a `the-loop start` comment made there become a spawn a runner would lease, and `status`
says how far behind the poller is."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.fake_github import REPOSITORY, FakeGitHub
from tests.fake_harness import wait_until
from tests.samples import AUTO_LABEL
from tests.test_up import UpProcess, cli

TOKEN_ENV = "LOOPRELAY_TEST_POLL_TOKEN"
TOKEN = "ghp_poll_test_token"
DEADLINE = 90.0
"""Generous: polls come every 5 s, and the machine is shared."""


@pytest.fixture
def polling_up(tmp_path: Path, fake_github: FakeGitHub) -> Iterator[tuple[UpProcess, Path]]:
    fake_github.tokens[TOKEN] = "looprelay-bot"
    config = tmp_path / "looprelay.yaml"
    config.write_text(
        "github:\n"
        f"  apiUrl: {fake_github.url}\n"
        f"  tokenEnv: {TOKEN_ENV}\n"
        "  poll:\n"
        f"    repositories: [{REPOSITORY}]\n"
        "    intervalSeconds: 5\n"
        "routing:\n"
        "  authorizedUsers: [codertocat]\n"
        "  botLogins: [looprelay-bot]\n"
    )
    up = UpProcess(tmp_path / "data", "--config", str(config), env=os.environ | {TOKEN_ENV: TOKEN})
    yield up, config
    up.stop(signal.SIGKILL)


def _status(up: UpProcess, config: Path) -> dict[str, Any]:
    shown = cli("status", "--config", str(config), "--data", str(up.data_dir), "--json")
    assert shown.returncode == 0, shown.stderr
    view: dict[str, Any] = json.loads(shown.stdout)
    return view


def _dispatches(up: UpProcess) -> list[dict[str, Any]]:
    listed = cli("dispatches", "--data", str(up.data_dir), "--json")
    return [json.loads(line) for line in listed.stdout.splitlines()]


def test_a_label_and_a_start_comment_polled_become_a_spawn_and_status_shows_the_poll(
    polling_up: tuple[UpProcess, Path], fake_github: FakeGitHub
) -> None:
    up, config = polling_up
    fake_github.poll.open_issue(1)

    def polled() -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = _status(up, config)["polling"]
        return rows if rows and rows[0]["polled_at"] else []

    wait_until(polled, seconds=DEADLINE, what="a first complete poll")
    fake_github.poll.label(1, AUTO_LABEL)
    comment_id = fake_github.poll.comment(1, "Ready when you are: the-loop start")

    [spawn] = wait_until(
        lambda: _dispatches(up), seconds=DEADLINE, what="the spawn of the polled start comment"
    )
    assert (spawn["kind"], spawn["status"], spawn["work_item"]) == (
        "spawn",
        "pending",
        f"github:{REPOSITORY}#1",
    )
    listed = cli("deliveries", "--data", str(up.data_dir), "--json").stdout.splitlines()
    ledger = {row["delivery_id"]: row["outcome"] for row in map(json.loads, listed)}
    assert [d for d, outcome in ledger.items() if outcome == "dispatched"] == [
        f"poll-comment-{comment_id}"
    ]
    [row] = _status(up, config)["polling"]
    assert row["repository"] == REPOSITORY and row["error"] == ""
    assert 0 <= row["behind_seconds"] < 60
    text = cli("status", "--config", str(config), "--data", str(up.data_dir)).stdout
    assert "POLLING" in text and REPOSITORY in text
    assert f"polling       {REPOSITORY} every 5 s" in up.stderr_path.read_text()
    page = requests.get(up.webhook_url.removesuffix("/webhook") + "/status", timeout=30)
    assert page.status_code == 200
    assert '<table id="polling">' in page.text and f'data-repository="{REPOSITORY}"' in page.text


def test_up_refuses_polling_without_github_credentials(tmp_path: Path) -> None:
    config = tmp_path / "looprelay.yaml"
    config.write_text(f"github:\n  poll:\n    repositories: [{REPOSITORY}]\n")
    started = cli("up", "--config", str(config), "--data", str(tmp_path / "data"), "--port", "0")
    assert started.returncode != 0
    assert "github.poll.repositories needs GitHub credentials" in started.stderr


@pytest.mark.parametrize("named", ["widgets", "octo/widgets/extra", "octo/.."])
def test_a_polled_repository_not_owner_repo_is_refused_by_name(tmp_path: Path, named: str) -> None:
    config = tmp_path / "looprelay.yaml"
    config.write_text(f'github:\n  poll:\n    repositories: ["{named}"]\n')
    checked = cli("config", "validate", str(config))
    assert checked.returncode != 0
    assert "github.poll.repositories" in checked.stderr and "is not owner/repo" in checked.stderr
