"""``GitHubRest``'s listing calls (the poll ingress's ``GitHubListings``) against the fake's
listings (tests/fake_github_poll.py), over real HTTP: pages, ETags, rate limits, App auth."""

from __future__ import annotations

from pathlib import Path

import pytest
import requests

from looprelay.adapters.clock import SystemClock
from looprelay.adapters.github.auth import AppAuth, TokenAuth
from looprelay.adapters.github.rest import GitHubRest
from looprelay.adapters.sqlite.poll_cursors import SqlitePollCursors
from looprelay.adapters.sqlite.store import SqliteStore
from looprelay.config.model import PollConfig, WebhookConfig
from looprelay.core.envelope import Envelope
from looprelay.errors import RateLimited
from looprelay.service.poller import PERMANENT_BACKOFF, Poller
from tests.embedded_queue_harness import EmbeddedQueueHarness
from tests.fake_github import APP_ID, INSTALLATION_ID, REPOSITORY, AppKey, FakeGitHub

TOKEN = "ghp_listings0123456789"


@pytest.fixture
def token_client(fake_github: FakeGitHub) -> GitHubRest:
    fake_github.tokens[TOKEN] = "operator"
    return GitHubRest(api_url=fake_github.url, auth=TokenAuth(TOKEN), sleep=lambda _: None)


@pytest.fixture
def app_client(fake_github: FakeGitHub, github_app_key: AppKey) -> GitHubRest:
    fake_github.app_public_key = github_app_key.public_key
    auth = AppAuth(
        app_id=APP_ID,
        private_key_pem=github_app_key.private_pem,
        api_url=fake_github.url,
        session=requests.Session(),
    )
    return GitHubRest(api_url=fake_github.url, auth=auth, sleep=lambda _: None)


def _poller(github: GitHubRest, tmp_path: Path, queue: EmbeddedQueueHarness) -> Poller:
    return Poller(
        github=github,
        cursors=SqlitePollCursors(tmp_path / "store.db"),
        ledger=SqliteStore(tmp_path / "store.db"),
        queue=queue.queue,
        clock=SystemClock(),
        config=PollConfig(repositories=[REPOSITORY]),
        webhook=WebhookConfig(),
    )


def test_a_spent_quota_stops_a_listing_before_its_next_page(
    fake_github: FakeGitHub, token_client: GitHubRest
) -> None:
    fake_github.poll.open_issue(1)
    for n in range(130):
        fake_github.poll.comment(1, f"note {n}")
    fake_github.poll.quota = 1  # the first page spends it: x-ratelimit-remaining: 0

    with pytest.raises(RateLimited) as raised:
        token_client.list_all(
            installation_id=None, repository=REPOSITORY, path="issues/comments", params={}
        )
    assert 3500 < raised.value.seconds <= 3600
    assert len(fake_github.calls("GET", r"/issues/comments$")) == 1


def test_an_unchanged_listing_is_a_304_that_costs_no_quota(
    fake_github: FakeGitHub, token_client: GitHubRest
) -> None:
    fake_github.poll.open_issue(1)
    fake_github.poll.quota = 10
    first = token_client.list_all(
        installation_id=None, repository=REPOSITORY, path="issues", params={"state": "all"}
    )
    again = token_client.list_all(
        installation_id=None,
        repository=REPOSITORY,
        path="issues",
        params={"state": "all"},
        etag=first.etag,
    )
    assert [item["number"] for item in first.items] == [1] and first.etag
    assert again.unchanged and again.items == [] and fake_github.poll.quota == 9


def test_token_auth_needs_no_installation(
    fake_github: FakeGitHub, token_client: GitHubRest
) -> None:
    assert token_client.repository_installation(REPOSITORY) is None
    assert fake_github.requests == []


def test_with_app_auth_a_polled_comment_carries_the_repositorys_installation(
    fake_github: FakeGitHub,
    app_client: GitHubRest,
    tmp_path: Path,
    embedded_queue_harness: EmbeddedQueueHarness,
) -> None:
    fake_github.poll.open_issue(1)
    poller = _poller(app_client, tmp_path, embedded_queue_harness)
    poller.run()
    comment_id = fake_github.poll.comment(1, "hello from the App's side")

    [report] = poller.run()

    assert report.queued >= 1 and report.error == ""
    queued = [Envelope.model_validate_json(b) for b in embedded_queue_harness.held().values()]
    [envelope] = [e for e in queued if e.delivery_id == f"poll-comment-{comment_id}"]
    assert envelope.installation_id == INSTALLATION_ID
    [asked] = fake_github.calls("GET", r"/installation$")
    assert asked.headers["authorization"].startswith("Bearer ey")  # the App's JWT
    listing = fake_github.calls("GET", r"/issues/comments$")[-1]
    assert listing.headers["authorization"] == "Bearer ghs_fake0001"  # the installation's


def test_a_repository_the_app_is_not_installed_on_is_left_alone_a_while(
    fake_github: FakeGitHub,
    app_client: GitHubRest,
    tmp_path: Path,
    embedded_queue_harness: EmbeddedQueueHarness,
) -> None:
    fake_github.script(match=r"GET .*/installation$", status=404, body={"message": "Not Found"})
    poller = _poller(app_client, tmp_path, embedded_queue_harness)

    [report] = poller.run()
    assert "not installed" in report.error and report.retry_at is not None
    backoff = report.retry_at - SystemClock().now()
    assert PERMANENT_BACKOFF - backoff < PERMANENT_BACKOFF / 10
    calls = len(fake_github.requests)
    [again] = poller.run()
    assert again.skipped and len(fake_github.requests) == calls
