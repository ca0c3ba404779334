"""post_once against the loopback fake GitHub over real HTTP: one comment, whatever GitHub
answers on the way (found by tests/faults/test_github_faults.py)."""

from __future__ import annotations

from typing import Any

import pytest

from looprelay.adapters.github.auth import TokenAuth
from looprelay.adapters.github.rest import GitHubRest
from looprelay.errors import Transient
from looprelay.service.comments import POST_ROUNDS, post_once
from tests.fake_github import APP_LOGIN, REPOSITORY, FakeGitHub

TOKEN = "ghp_comments_test"


@pytest.fixture
def client(fake_github: FakeGitHub) -> GitHubRest:
    """A client acting as the App's bot, with a short timeout and no real sleeping."""
    fake_github.tokens[TOKEN] = APP_LOGIN
    return GitHubRest(
        api_url=fake_github.url, auth=TokenAuth(TOKEN), timeout_seconds=0.3, sleep=lambda _: None
    )


def _post(client: GitHubRest) -> int:
    return post_once(
        client,
        installation_id=None,
        repository=REPOSITORY,
        number=3,
        body="Attach with tmux",
        kind="attach",
        marker_id="dp-1",
        bot_logins=[APP_LOGIN],
    )


class TestPostOnce:
    @pytest.mark.parametrize(
        "answer",
        [{"status": 502}, {"status": 500}, {"delay": 0.8}],
        ids=["502", "500", "timeout"],
    )
    def test_a_post_github_stored_but_answered_badly_is_found_not_posted_again(
        self, client: GitHubRest, fake_github: FakeGitHub, answer: dict[str, Any]
    ) -> None:
        fake_github.script(match="POST", after=True, **answer)

        comment_id = _post(client)

        [comment] = fake_github.on(3)
        assert comment.id == comment_id and comment.author == APP_LOGIN
        assert len(fake_github.calls("POST")) == 1

    def test_a_post_github_refused_is_posted_again_once(
        self, client: GitHubRest, fake_github: FakeGitHub
    ) -> None:
        fake_github.script(match="POST", status=502)

        comment_id = _post(client)

        assert [c.id for c in fake_github.on(3)] == [comment_id]
        assert len(fake_github.calls("POST")) == 2

    def test_when_every_round_fails_it_is_transient_and_nothing_was_posted(
        self, client: GitHubRest, fake_github: FakeGitHub
    ) -> None:
        fake_github.script(10, match="POST", status=503)

        with pytest.raises(Transient, match="may have carried it out"):
            _post(client)

        assert fake_github.on(3) == []
        assert len(fake_github.calls("POST")) == POST_ROUNDS

    def test_a_comment_already_there_is_not_posted_again(
        self, client: GitHubRest, fake_github: FakeGitHub
    ) -> None:
        first = _post(client)

        assert _post(client) == first
        assert len(fake_github.on(3)) == 1
