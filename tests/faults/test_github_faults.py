"""GitHub misbehaving under N deliveries, on real processes: `looprelay up` with App auth
against the loopback fake GitHub, one `looprelay runner run` agent with the fake `claude`.

The fake answers some calls 500 (not done), 502 after it stored the comment, 403 secondary
rate limit with ``Retry-After``, and hangs past the client's 10 s timeout (once before doing
the call, once after storing the comment); the App's token exchange fails once too. What a user
would notice is checked: each delivery settled once, each comment's text applied once in
order, one checklist and one attach comment per work item, 👀 and 🎉 on every comment, the
asked wait kept (from the fake's recorded request times), timed-out calls tried again.
"""

from __future__ import annotations

import random
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fake_github import APP_ID, APP_LOGIN, AppKey, FakeComment, FakeGitHub, RecordedRequest
from tests.fake_harness import FakeHarness, wait_until
from tests.faults.deliveries import seeded_random
from tests.faults.runners import (
    DEADLINE,
    REPO,
    REPOSITORY,
    Runner,
    Stack,
    assert_applied_once_in_order,
    comment_plan,
    commented,
    register_runner,
    socket_name,
    start_stack,
    start_work_items,
    token,
)

__all__ = ["socket_name"]  # the fixture, imported for pytest

INSTALLATION = 77
KEY_ENV = "LOOPRELAY_FAULTS_APP_KEY"
RETRY_AFTER = 2
CLIENT_TIMEOUT = 10.0
"""GitHubRest's per-request timeout as `looprelay up` builds it."""
REACTIONS = r"POST /repos/[^/]+/[^/]+/issues/comments/\d+/reactions$"
COMMENTS = r"POST /repos/[^/]+/[^/]+/issues/\d+/comments$"
LIMITED = {"message": "You have exceeded a secondary rate limit. Please wait a few minutes."}


@pytest.fixture
def github(fake_github: FakeGitHub, github_app_key: AppKey) -> FakeGitHub:
    fake_github.app_public_key = github_app_key.public_key
    fake_github.repositories |= {REPO, REPOSITORY}
    return fake_github


@pytest.fixture
def stack(
    tmp_path: Path, github: FakeGitHub, github_app_key: AppKey, fake_harness: FakeHarness
) -> Iterator[Stack]:
    config = f"""\
github:
  apiUrl: {github.url}
  appId: {APP_ID}
  privateKeyEnv: {KEY_ENV}
routing:
  authorizedUsers: [codertocat]
  botLogins: ["{APP_LOGIN}"]
runners:
  leaseSeconds: 10
  pollWaitSeconds: 1
  heartbeatSeconds: 5
"""
    started = start_stack(tmp_path, config, {KEY_ENV: github_app_key.private_pem})
    yield started
    started.close()
    started.up.stop(signal.SIGKILL)


@pytest.fixture
def runner(stack: Stack, tmp_path: Path, socket_name: str) -> Iterator[Runner]:
    box = register_runner(stack, tmp_path, "box", socket_name=socket_name, capacity=2)
    box.start()
    yield box
    box.kill()


def _commented_on_github(github: FakeGitHub, number: int, comment_id: int, body: str) -> None:
    """The human comment a delivery is about, as GitHub holds it (reactions go there)."""
    github.comments[comment_id] = FakeComment(comment_id, REPO, number, "Codertocat", body)


def _retry_of(github: FakeGitHub, first: RecordedRequest) -> RecordedRequest | None:
    """The next request making the same call (method, path and body) after ``first``."""
    return next(
        (
            r
            for r in github.requests
            if r.at > first.at
            and (r.method, r.path, r.json) == (first.method, first.path, first.json)
        ),
        None,
    )


def _bot_kinds(github: FakeGitHub, number: int) -> list[str]:
    """The kinds of looprelay's own comments on issue ``number``, sorted."""
    return sorted(
        re.findall(r"kind=(\w+)", c.body)[0]
        for c in github.on(number, REPO)
        if c.author == APP_LOGIN
    )


def _matching(github: FakeGitHub, pattern: str) -> list[RecordedRequest]:
    """Requests whose ``METHOD /path`` matches, in arrival order (the order scripts apply)."""
    return [r for r in github.requests if re.search(pattern, f"{r.method} {r.path}")]


class TestGitHubFaults:
    def test_errors_rate_limits_and_timeouts_leave_one_of_each_effect_and_block_nothing(
        self,
        stack: Stack,
        github: FakeGitHub,
        runner: Runner,
        fake_harness: FakeHarness,
        request: pytest.FixtureRequest,
    ) -> None:
        rng: random.Random = seeded_random(request.node.nodeid)
        numbers, comments = [1, 2, 3, 4], 20
        github.script(match=r"POST /app/installations/\d+/access_tokens", status=502)
        # Scripts of one pattern apply in the order given to the first matching calls.
        github.script(3, match=REACTIONS, status=500)
        github.script(match=REACTIONS, status=403, headers={"Retry-After": "2"}, body=LIMITED)
        github.script(match=REACTIONS, status=504, delay=CLIENT_TIMEOUT + 0.5)
        github.script(2, match=COMMENTS, status=502, after=True)
        github.script(match=COMMENTS, status=403, headers={"Retry-After": "2"}, body=LIMITED)
        github.script(match=COMMENTS, delay=CLIENT_TIMEOUT + 0.5, after=True)
        for n in numbers:
            _commented_on_github(github, n, 9000 + n, f"the-loop start {token(n, 0)}")
        plan = comment_plan(numbers, comments, rng)
        for n, i in plan:
            _commented_on_github(github, n, n * 1000 + i, token(n, i))

        starts = start_work_items(stack, numbers, installation=INSTALLATION)
        sent = [
            stack.send(
                "issue_comment",
                commented(
                    n,
                    f"Comment {i}: {token(n, i)}",
                    comment_id=n * 1000 + i,
                    installation=INSTALLATION,
                ),
            )
            for n, i in plan
        ]

        records = stack.wait_settled([*starts.values(), *sent])
        assert {r.outcome for r in records} == {"dispatched"}
        counts = stack.settled_counts()
        assert [counts[r.delivery_id] for r in records] == [1] * len(records)
        dispatches = stack.wait_dispatches_settled(len(numbers) + comments)
        assert [d.status for d in dispatches] == ["succeeded"] * len(dispatches)
        assert_applied_once_in_order(dispatches, fake_harness)

        # One checklist and one attach comment per work item, whatever GitHub answered. The
        # runner API posts after recording the result, so the last may still be on its way.
        for n in numbers:
            wait_until(
                lambda n=n: len(_bot_kinds(github, n)) >= 2,
                seconds=DEADLINE,
                what=f"#{n}'s checklist and attach comments",
            )
            assert _bot_kinds(github, n) == ["attach", "checklist"], n
        # 👀 when routed, 🎉 when applied, on every comment, once each.
        human = [c for c in github.comments.values() if c.author == "Codertocat"]
        wait_until(
            lambda: all(len(c.reactions) >= 2 for c in human),
            seconds=DEADLINE,
            what="two reactions on every comment",
        )
        assert {c.id: sorted(content for _, content in c.reactions) for c in human} == {
            c.id: ["eyes", "hooray"] for c in human
        }

        reactions, posts = _matching(github, REACTIONS), _matching(github, COMMENTS)
        for failed in reactions[:3]:  # 500: not done, so done again
            assert _retry_of(github, failed) is not None
        for limited in (reactions[3], posts[2]):  # Retry-After kept
            retry = _retry_of(github, limited)
            assert retry is not None and retry.at - limited.at >= RETRY_AFTER
        assert _retry_of(github, reactions[4]) is not None  # timed out: tried again
        for stored in (posts[0], posts[1], posts[3]):  # stored, answered 502 or never: found
            assert _retry_of(github, stored) is None
        failed = stack.store.list_events(name="github.failed")
        assert failed == [], [e.data for e in failed]
