"""GitHubRest and its auth against the loopback fake GitHub, over real HTTP (no mocks)."""

from __future__ import annotations

import socket
from typing import Any

import pytest
import requests

from looprelay.adapters.github.auth import AppAuth, TokenAuth
from looprelay.adapters.github.rest import MAX_PAGES, GitHubRest
from looprelay.config.model import GitHubConfig
from looprelay.errors import ConfigError, Permanent, Transient
from looprelay.ports import CommentText
from tests.fake_github import (
    APP_ID,
    APP_LOGIN,
    INSTALLATION_ID,
    REPOSITORY,
    AppKey,
    FakeGitHub,
    make_app_key,
)

TOKEN = "ghp_test0123456789secret"
LOGIN = "relay-operator"
NOW = 1_700_000_000.0


class _Clock:
    """A clock the test moves by hand (epoch seconds)."""

    def __init__(self, now: float = NOW) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def waits() -> list[float]:
    """Every wait the client asked for, in order (it never really sleeps)."""
    return []


def _client(fake: FakeGitHub, waits: list[float], **overrides: Any) -> GitHubRest:
    fields: dict[str, Any] = {"auth": TokenAuth(TOKEN), "timeout_seconds": 2.0}
    return GitHubRest(api_url=fake.url, sleep=waits.append, **(fields | overrides))


@pytest.fixture
def client(fake_github: FakeGitHub, waits: list[float]) -> GitHubRest:
    """A token-auth client whose token the fake knows as ``LOGIN``."""
    fake_github.tokens[TOKEN] = LOGIN
    return _client(fake_github, waits)


def _create(client: GitHubRest, body: str = "hello", **overrides: Any) -> int:
    fields: dict[str, Any] = {"installation_id": None, "repository": REPOSITORY, "number": 7}
    return client.create_comment(**(fields | overrides), body=body)


def _get(client: GitHubRest, comment_id: int, installation_id: int | None = None) -> Any:
    return client.get_comment(
        installation_id=installation_id, repository=REPOSITORY, comment_id=comment_id
    )


def _find(client: GitHubRest, needle: str, number: int = 1) -> int | None:
    return client.find_comment_with(
        installation_id=None, repository=REPOSITORY, number=number, needle=needle
    )


class TestComments:
    def test_a_comment_is_posted_as_the_token_user_and_its_id_returned(
        self, client: GitHubRest, fake_github: FakeGitHub
    ) -> None:
        comment_id = _create(client, "first words")

        [stored] = fake_github.on(7)
        assert (stored.id, stored.author, stored.body) == (comment_id, LOGIN, "first words")
        [request] = fake_github.calls("POST")
        assert request.path == f"/repos/{REPOSITORY}/issues/7/comments"
        assert request.json == {"body": "first words"}

    def test_every_request_carries_the_documented_headers(
        self, client: GitHubRest, fake_github: FakeGitHub
    ) -> None:
        _create(client)

        [request] = fake_github.requests
        assert request.headers["accept"] == "application/vnd.github+json"
        assert request.headers["x-github-api-version"] == "2022-11-28"
        assert request.headers["user-agent"].startswith("looprelay")
        assert request.headers["authorization"] == f"Bearer {TOKEN}"

    def test_find_returns_the_comment_holding_the_needle(
        self, client: GitHubRest, fake_github: FakeGitHub
    ) -> None:
        fake_github.add_comment("unrelated")
        wanted = fake_github.add_comment("done <!-- looprelay:d-42 -->")

        assert _find(client, "looprelay:d-42") == wanted
        assert _find(client, "looprelay:d-43") is None

    def test_find_follows_the_link_header_page_by_page(
        self, client: GitHubRest, fake_github: FakeGitHub
    ) -> None:
        ids = [fake_github.add_comment(f"comment {n}") for n in range(250)]

        assert _find(client, "comment 240") == ids[240]
        pages = [r.query for r in fake_github.calls("GET")]
        assert pages == [
            {"per_page": ["100"]},
            {"per_page": ["100"], "page": ["2"]},
            {"per_page": ["100"], "page": ["3"]},
        ]

    def test_find_reads_at_most_ten_pages(
        self, client: GitHubRest, fake_github: FakeGitHub
    ) -> None:
        for n in range(MAX_PAGES * 100):
            fake_github.add_comment(f"comment {n}")
        fake_github.add_comment("the marker, on page 11")

        assert _find(client, "the marker") is None
        assert len(fake_github.calls("GET")) == MAX_PAGES

    def test_find_refuses_to_follow_a_next_page_on_another_host(
        self, client: GitHubRest, fake_github: FakeGitHub
    ) -> None:
        elsewhere = '<https://elsewhere.example/x?page=2>; rel="next"'
        fake_github.script(match="GET", status=200, headers={"Link": elsewhere}, body=[])

        with pytest.raises(Permanent, match="another host"):
            _find(client, "marker")
        assert len(fake_github.requests) == 1

    def test_find_needs_a_needle(self, client: GitHubRest, fake_github: FakeGitHub) -> None:
        with pytest.raises(ValueError, match="non-empty needle"):
            _find(client, "")
        assert fake_github.requests == []

    def test_get_comment_reads_the_current_author_and_body(
        self, client: GitHubRest, fake_github: FakeGitHub
    ) -> None:
        comment_id = fake_github.add_comment("/relay go", author="alice")
        fake_github.comments[comment_id].body = "/relay go (edited)"

        assert _get(client, comment_id) == CommentText(comment_id, "alice", "/relay go (edited)")

    def test_a_deleted_comment_reads_as_none(
        self, client: GitHubRest, fake_github: FakeGitHub, waits: list[float]
    ) -> None:
        assert _get(client, 999_999) is None
        assert (len(fake_github.requests), waits) == (1, [])

    def test_a_comment_of_a_deleted_user_has_an_empty_author(
        self, client: GitHubRest, fake_github: FakeGitHub
    ) -> None:
        comment_id = fake_github.add_comment("orphan", author=None)

        assert _get(client, comment_id) == CommentText(comment_id, "", "orphan")


class TestReactions:
    @pytest.mark.parametrize(("kind", "segment"), [("issue", "issues"), ("review", "pulls")])
    def test_a_reaction_goes_to_the_endpoint_of_the_comment_kind(
        self, client: GitHubRest, fake_github: FakeGitHub, kind: str, segment: str
    ) -> None:
        comment_id = fake_github.add_comment("please look", kind=kind)

        _react(client, comment_id, kind, "eyes")

        assert fake_github.comments[comment_id].reactions == [(LOGIN, "eyes")]
        [request] = fake_github.calls("POST")
        assert request.path == f"/repos/{REPOSITORY}/{segment}/comments/{comment_id}/reactions"
        assert request.json == {"content": "eyes"}

    def test_reacting_twice_is_harmless(self, client: GitHubRest, fake_github: FakeGitHub) -> None:
        comment_id = fake_github.add_comment("please look")

        _react(client, comment_id, "issue", "hooray")
        _react(client, comment_id, "issue", "hooray")  # GitHub answers 200 this time

        assert fake_github.comments[comment_id].reactions == [(LOGIN, "hooray")]

    @pytest.mark.parametrize(("kind", "content"), [("commit", "eyes"), ("issue", "thumbsup")])
    def test_an_unknown_kind_or_content_is_refused_before_any_request(
        self, client: GitHubRest, fake_github: FakeGitHub, kind: str, content: str
    ) -> None:
        with pytest.raises(ValueError, match="REACTIONS"):
            _react(client, 1, kind, content)
        assert fake_github.requests == []


def _react(client: GitHubRest, comment_id: int, kind: str, content: str) -> None:
    client.add_reaction(
        installation_id=None,
        repository=REPOSITORY,
        comment_id=comment_id,
        comment_kind=kind,
        content=content,
    )


@pytest.fixture
def clock(fake_github: FakeGitHub) -> _Clock:
    """One hand-moved clock for the client, its App auth and the fake."""
    shared = _Clock()
    fake_github.clock = shared
    return shared


def _app_client(
    fake: FakeGitHub, key: AppKey, clock: _Clock, waits: list[float], app_id: int = APP_ID
) -> GitHubRest:
    fake.app_public_key = key.public_key
    auth = AppAuth(
        app_id=app_id,
        private_key_pem=key.private_pem,
        api_url=fake.url,
        session=requests.Session(),
        clock=clock,
    )
    return _client(fake, waits, auth=auth, clock=clock)


class TestAppAuth:
    def test_the_jwt_is_verified_and_the_installation_token_used(
        self, fake_github: FakeGitHub, github_app_key: AppKey, clock: _Clock, waits: list[float]
    ) -> None:
        client = _app_client(fake_github, github_app_key, clock, waits)

        _create(client, installation_id=INSTALLATION_ID)

        exchange, post = fake_github.requests
        assert (exchange.method, exchange.path) == (
            "POST",
            f"/app/installations/{INSTALLATION_ID}/access_tokens",
        )
        assert exchange.headers["accept"] == "application/vnd.github+json"
        assert fake_github.jwt_claims == [{"iat": NOW - 60, "exp": NOW + 540, "iss": str(APP_ID)}]
        assert post.headers["authorization"] == "Bearer ghs_fake0001"
        assert fake_github.on(7)[0].author == APP_LOGIN

    def test_the_token_is_cached_until_a_minute_before_it_expires(
        self, fake_github: FakeGitHub, github_app_key: AppKey, clock: _Clock, waits: list[float]
    ) -> None:
        client = _app_client(fake_github, github_app_key, clock, waits)

        for _ in range(3):
            _create(client, installation_id=INSTALLATION_ID)
        clock.now += 3600 - 61
        _create(client, installation_id=INSTALLATION_ID)
        assert len(fake_github.calls("POST", "access_tokens")) == 1

        clock.now += 2
        _create(client, installation_id=INSTALLATION_ID)
        assert len(fake_github.calls("POST", "access_tokens")) == 2
        last = fake_github.calls("POST", "comments")[-1]
        assert last.headers["authorization"] == "Bearer ghs_fake0002"

    def test_each_installation_gets_its_own_token(
        self, fake_github: FakeGitHub, github_app_key: AppKey, clock: _Clock, waits: list[float]
    ) -> None:
        fake_github.installations.add(78)
        client = _app_client(fake_github, github_app_key, clock, waits)

        for installation in (INSTALLATION_ID, 78, INSTALLATION_ID, 78):
            _create(client, installation_id=installation)

        assert [issued[0] for issued in fake_github.issued] == [INSTALLATION_ID, 78]

    def test_app_auth_without_an_installation_is_permanent(
        self, fake_github: FakeGitHub, github_app_key: AppKey, clock: _Clock, waits: list[float]
    ) -> None:
        client = _app_client(fake_github, github_app_key, clock, waits)

        with pytest.raises(Permanent, match="installation id"):
            _create(client, installation_id=None)
        assert fake_github.requests == []

    @pytest.mark.parametrize("wrong", ["key", "app_id"])
    def test_a_jwt_github_refuses_is_permanent_and_never_quoted(
        self, fake_github: FakeGitHub, github_app_key: AppKey, clock: _Clock, wrong: str
    ) -> None:
        waits: list[float] = []
        key = make_app_key() if wrong == "key" else github_app_key
        client = _app_client(fake_github, key, clock, waits, app_id=APP_ID + int(wrong == "app_id"))
        fake_github.app_public_key = github_app_key.public_key

        with pytest.raises(Permanent, match="HTTP 401") as raised:
            _create(client, installation_id=INSTALLATION_ID)
        sent_jwt = fake_github.requests[0].headers["authorization"].split()[1]
        assert sent_jwt not in str(raised.value)
        assert "PRIVATE KEY" not in str(raised.value)
        assert (len(fake_github.requests), waits) == (1, [])

    def test_a_failed_exchange_is_retried_within_the_budget(
        self, fake_github: FakeGitHub, github_app_key: AppKey, clock: _Clock, waits: list[float]
    ) -> None:
        fake_github.script(match="access_tokens", status=502)
        client = _app_client(fake_github, github_app_key, clock, waits)

        _create(client, installation_id=INSTALLATION_ID)

        assert len(fake_github.calls("POST", "access_tokens")) == 2
        assert len(waits) == 1

    def test_a_key_that_is_not_pem_is_refused_up_front(self) -> None:
        with pytest.raises(ValueError, match="not a PEM private key"):
            AppAuth(
                app_id=APP_ID,
                private_key_pem="-----BEGIN NONSENSE-----",
                api_url="http://127.0.0.1:9",
                session=requests.Session(),
            )


class TestRetries:
    @pytest.mark.parametrize("status", [500, 502, 503])
    def test_server_errors_are_retried_with_growing_jittered_waits(
        self, client: GitHubRest, fake_github: FakeGitHub, waits: list[float], status: int
    ) -> None:
        fake_github.script(2, match="GET", status=status, body={"message": "Server Error"})
        comment_id = fake_github.add_comment("marker <!-- d-1 -->", number=7)

        assert _find(client, "d-1", number=7) == comment_id

        assert len(fake_github.calls("GET")) == 3
        assert 0.25 <= waits[0] <= 0.5
        assert 0.5 <= waits[1] <= 1.0

    def test_a_secondary_rate_limit_waits_what_retry_after_says(
        self, client: GitHubRest, fake_github: FakeGitHub, waits: list[float]
    ) -> None:
        limited = {"message": "You have exceeded a secondary rate limit."}
        fake_github.script(match="POST", status=403, headers={"Retry-After": "1"}, body=limited)

        _create(client)

        assert waits == [1.0]
        assert len(fake_github.calls("POST")) == 2

    def test_an_exhausted_rate_limit_waits_until_the_reset(
        self, fake_github: FakeGitHub, waits: list[float]
    ) -> None:
        fake_github.tokens[TOKEN] = LOGIN
        client = _client(fake_github, waits, clock=_Clock())
        headers = {"x-ratelimit-remaining": "0", "x-ratelimit-reset": str(int(NOW) + 7)}
        fake_github.script(match="GET", status=403, headers=headers, body={"message": "limit"})

        assert _find(client, "anything") is None
        assert waits == [7.0]

    @pytest.mark.parametrize(
        ("headers", "expected"), [({}, None), ({"Retry-After": "2"}, 2.0)], ids=["bare", "asked"]
    )
    def test_too_many_requests_is_retried(
        self,
        client: GitHubRest,
        fake_github: FakeGitHub,
        waits: list[float],
        headers: dict[str, str],
        expected: float | None,
    ) -> None:
        fake_github.script(match="GET", status=429, headers=headers)

        assert _find(client, "anything") is None
        [wait] = waits
        if expected is None:
            assert 0.25 <= wait <= 0.5  # the first backoff step, jittered
        else:
            assert wait == expected

    @pytest.mark.parametrize(
        ("headers", "body"),
        [
            ({"Retry-After": "120"}, {}),
            ({}, {"message": "You have exceeded a secondary rate limit"}),
        ],
        ids=["retry-after", "no-header"],
    )
    def test_a_rate_limit_longer_than_max_wait_gives_up_at_once(
        self,
        client: GitHubRest,
        fake_github: FakeGitHub,
        waits: list[float],
        headers: dict[str, str],
        body: dict[str, str],
    ) -> None:
        fake_github.script(match="POST", status=403, headers=headers, body=body)

        with pytest.raises(Transient, match="HTTP 403"):
            _create(client)
        assert (len(fake_github.requests), waits) == (1, [])

    def test_a_timeout_is_retried(self, fake_github: FakeGitHub, waits: list[float]) -> None:
        fake_github.tokens[TOKEN] = LOGIN
        client = _client(fake_github, waits, timeout_seconds=0.3)
        comment_id = fake_github.add_comment("still here")
        fake_github.script(match="GET", delay=1.0)

        assert _get(client, comment_id) == CommentText(comment_id, "octocat", "still here")
        assert len(fake_github.calls("GET")) == 2
        assert len(waits) == 1

    @pytest.mark.parametrize(
        "answer",
        [{"status": 502}, {"delay": 0.8}],
        ids=["502-after-storing", "timeout-after-storing"],
    )
    def test_a_comment_post_github_may_have_stored_is_not_repeated(
        self, fake_github: FakeGitHub, waits: list[float], answer: dict[str, Any]
    ) -> None:
        """Posting it again would post it twice; comments.post_once looks for its marker."""
        fake_github.tokens[TOKEN] = LOGIN
        client = _client(fake_github, waits, timeout_seconds=0.3)
        fake_github.script(match="POST", after=True, **answer)

        with pytest.raises(Transient, match="may have carried it out"):
            _create(client, "marker <!-- d-1 -->")

        assert [c.body for c in fake_github.on(7)] == ["marker <!-- d-1 -->"]
        assert (len(fake_github.calls("POST")), waits) == (1, [])

    def test_giving_up_after_max_attempts_is_transient(
        self, client: GitHubRest, fake_github: FakeGitHub, waits: list[float]
    ) -> None:
        fake_github.script(10, match="GET", status=502)

        with pytest.raises(Transient, match="failed 4 times, last HTTP 502") as raised:
            _find(client, "anything")
        assert len(fake_github.requests) == 4
        assert len(waits) == 3
        assert TOKEN not in str(raised.value)

    def test_an_unreachable_server_is_transient(self, waits: list[float]) -> None:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        client = GitHubRest(
            api_url=f"http://127.0.0.1:{port}", auth=TokenAuth(TOKEN), sleep=waits.append
        )

        with pytest.raises(Transient, match="ConnectionError"):
            _find(client, "anything")
        assert len(waits) == 3

    def test_a_forbidden_answer_without_rate_limit_signals_is_permanent(
        self, client: GitHubRest, fake_github: FakeGitHub, waits: list[float]
    ) -> None:
        forbidden = {"message": "Resource not accessible by integration"}
        fake_github.script(match="POST", status=403, body=forbidden)

        with pytest.raises(Permanent, match="HTTP 403 'Resource not accessible by integration'"):
            _create(client)
        assert (len(fake_github.requests), waits) == (1, [])


class TestPermanentAnswers:
    @pytest.mark.parametrize(
        ("status", "token", "overrides"),
        [
            (404, TOKEN, {"repository": "octo/missing"}),
            (422, TOKEN, {"body": ""}),
            (422, TOKEN, {"body": "x" * 65_537}),
            (401, "ghp_revoked0000secret", {}),
        ],
        ids=["404-unknown-repo", "422-empty", "422-too-long", "401-bad-token"],
    )
    def test_a_client_error_is_permanent_names_the_call_and_hides_the_token(
        self,
        fake_github: FakeGitHub,
        waits: list[float],
        status: int,
        token: str,
        overrides: dict[str, Any],
    ) -> None:
        fake_github.tokens[TOKEN] = LOGIN
        client = _client(fake_github, waits, auth=TokenAuth(token))

        with pytest.raises(Permanent) as raised:
            _create(client, **({"body": "hi"} | overrides))

        message = str(raised.value)
        repository = overrides.get("repository", REPOSITORY)
        assert f"POST /repos/{repository}/issues/7/comments: HTTP {status}" in message
        assert token not in message
        assert (len(fake_github.requests), waits) == (1, [])


class TestRepositoryValidation:
    @pytest.mark.parametrize(
        "repository",
        [
            "",
            "octo",
            "octo/widgets/extra",
            "../etc",
            "octo/..",
            "octo/.",
            "octo/wid gets",
            "octo/widgets?per_page=1",
            "octo/widgets#1",
            "octo/%2e%2e",
            "octo/widgets\n",
            "-octo/widgets",
        ],
    )
    def test_a_repository_that_is_not_owner_slash_name_is_refused(
        self, client: GitHubRest, fake_github: FakeGitHub, repository: str
    ) -> None:
        with pytest.raises(ValueError, match="is not owner/name"):
            _create(client, repository=repository)
        with pytest.raises(ValueError, match="is not owner/name"):
            client.get_comment(installation_id=None, repository=repository, comment_id=1)
        assert fake_github.requests == []

    @pytest.mark.parametrize("repository", ["octo/widgets", "my-org/repo.name_2", "a/.github"])
    def test_real_repository_names_pass(
        self, client: GitHubRest, fake_github: FakeGitHub, repository: str
    ) -> None:
        fake_github.repositories.add(repository)

        assert _create(client, repository=repository) > 0


class TestFromConfig:
    def test_token_auth_reads_the_named_variable(self, fake_github: FakeGitHub) -> None:
        fake_github.tokens[TOKEN] = LOGIN
        cfg = GitHubConfig(api_url=fake_github.url, token_env="GH_TOKEN")

        client = GitHubRest.from_config(cfg, {"GH_TOKEN": TOKEN})

        _create(client)
        assert fake_github.on(7)[0].author == LOGIN

    @pytest.mark.parametrize("escaped", [False, True], ids=["pem", "one-line-pem"])
    def test_app_auth_reads_the_key_from_the_named_variable(
        self, fake_github: FakeGitHub, github_app_key: AppKey, escaped: bool
    ) -> None:
        fake_github.app_public_key = github_app_key.public_key
        pem = github_app_key.private_pem
        environ = {"GH_APP_KEY": pem.replace("\n", "\\n") if escaped else pem}
        cfg = GitHubConfig(api_url=fake_github.url, app_id=APP_ID, private_key_env="GH_APP_KEY")

        _create(GitHubRest.from_config(cfg, environ), installation_id=INSTALLATION_ID)

        assert fake_github.on(7)[0].author == APP_LOGIN

    def test_no_credentials_names_the_keys_to_set(self) -> None:
        with pytest.raises(ConfigError) as raised:
            GitHubRest.from_config(GitHubConfig(), {})
        for key in ("github.appId", "github.privateKeyEnv", "github.tokenEnv"):
            assert key in str(raised.value)

    @pytest.mark.parametrize("value", [None, "", "   "], ids=["unset", "empty", "blank"])
    @pytest.mark.parametrize(
        "fields",
        [{"token_env": "GH_SECRET"}, {"app_id": APP_ID, "private_key_env": "GH_SECRET"}],
        ids=["token", "app"],
    )
    def test_a_named_variable_that_is_unset_or_empty_is_named(
        self, fields: dict[str, Any], value: str | None
    ) -> None:
        environ = {} if value is None else {"GH_SECRET": value}

        with pytest.raises(ConfigError, match="GH_SECRET"):
            GitHubRest.from_config(GitHubConfig(**fields), environ)

    def test_a_key_that_is_not_pem_is_named_but_not_quoted(self) -> None:
        cfg = GitHubConfig(app_id=APP_ID, private_key_env="GH_APP_KEY")

        with pytest.raises(ConfigError, match="GH_APP_KEY") as raised:
            GitHubRest.from_config(cfg, {"GH_APP_KEY": "sekrit-not-a-key"})
        assert "sekrit" not in str(raised.value)
