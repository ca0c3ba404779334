"""Where a session's comment goes, and which sessions may speak, through the runner API over
real HTTP on each store (the agent's side: tests/agent/test_session_comments.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests

from looprelay.core.markers import read_marker
from looprelay.core.model import SessionRecord
from looprelay.core.prsessions import tmux_session_name
from looprelay.service.runner_secrets import hash_credential
from tests.dispatches import work_item_ref
from tests.fake_github import APP_LOGIN, REPOSITORY, FakeGitHub
from tests.rigs import Stores
from tests.test_leases import HTTP_TIMEOUT, Desk, serve_desk

TOKEN = "lrses_" + "t" * 43
OTHER_REPOSITORY = "octo/other-repo"
"""Where work item #1's pull request #30 lives: its session posts there."""


@pytest.fixture
def desk(stores: Stores, fake_github: FakeGitHub) -> Iterator[Desk]:
    fake_github.repositories.add(OTHER_REPOSITORY)
    yield from serve_desk(stores, fake_github)


def _give_token(desk: Desk, endpoint: str, *, status: str = "live", repository: str = "") -> None:
    """Work item #1 with a session at ``endpoint`` holding :data:`TOKEN`'s hash."""
    ref = work_item_ref(REPOSITORY, 1)
    desk.seed(1, session_status="live")
    item = desk.stores.work_items.get_work_item(ref)
    assert item is not None
    session = SessionRecord(
        endpoint=endpoint,
        session_name=tmux_session_name(endpoint),
        session_id="0b9d6f4e-3a53-4d7c-9a55-2f0f6f4b1c11",
        harness="claude",
        runner_kind="tmux",
        interaction="work-item",
        status=status,
        repository=repository,
        token_hash=hash_credential(TOKEN),
    )
    sessions = dict(item.sessions) | {endpoint: session}
    assert desk.stores.work_items.save_work_item(
        item.model_copy(update={"sessions": sessions}), expected_version=item.version
    )


def _say(desk: Desk, endpoint: str, body: str, *, ask: bool = False) -> requests.Response:
    sent: dict[str, Any] = {
        "work_item": work_item_ref(REPOSITORY, 1),
        "endpoint": endpoint,
        "body": body,
        "key": "k-1",
    }
    return requests.post(
        f"{desk.url}/runner/v1/{'session-ask' if ask else 'session-comment'}",
        json=sent,
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=HTTP_TIMEOUT,
    )


class TestWhereItGoes:
    def test_a_pull_request_sessions_comment_goes_on_its_pull_request(self, desk: Desk) -> None:
        pull = work_item_ref(OTHER_REPOSITORY, 30)
        _give_token(desk, pull, repository=OTHER_REPOSITORY)
        answer = _say(desk, pull, "Rebased on main.")
        assert answer.status_code == 201, answer.text
        [comment] = [c for c in desk.github.on(30, OTHER_REPOSITORY) if c.author == APP_LOGIN]
        assert comment.body.startswith("Rebased on main.")
        assert answer.json() == {
            "comment_id": comment.id,
            "on": pull,
            "cut": False,
            "awaiting_input": False,
        }
        assert desk.github.on(1, REPOSITORY) == []

    def test_the_same_key_twice_posts_once(self, desk: Desk) -> None:
        own = work_item_ref(REPOSITORY, 1)
        _give_token(desk, own)
        first, again = _say(desk, own, "Once."), _say(desk, own, "Once.")
        assert first.json()["comment_id"] == again.json()["comment_id"]
        [comment] = desk.github.on(1, REPOSITORY)
        marker = read_marker(comment.body)
        assert marker is not None and (marker.kind, marker.id) == ("session-comment", "k-1")


class TestWhoMaySpeak:
    @pytest.mark.parametrize("status", ["terminated", "cleaned"])
    def test_an_ended_session_may_not(self, desk: Desk, status: str) -> None:
        own = work_item_ref(REPOSITORY, 1)
        _give_token(desk, own, status=status)
        refused = _say(desk, own, "Still here?")
        assert refused.status_code == 401 and status in refused.json()["error"]
        assert desk.github.on(1, REPOSITORY) == []

    def test_a_session_without_a_token_may_not(self, desk: Desk) -> None:
        desk.seed(1, session_status="live")
        refused = _say(desk, work_item_ref(REPOSITORY, 1), "Hello?")
        assert refused.status_code == 401
        assert desk.github.on(1, REPOSITORY) == []
