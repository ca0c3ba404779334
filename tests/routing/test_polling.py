"""The poll ingress end to end on each store, with no webhook: the fake GitHub's listings
(``tests/fake_github_poll.py``, over real HTTP through ``GitHubRest``) polled into the real
embedded queue, whose tasks go to the real worker and router as the queue would send them.

A label arms an issue, a ``the-loop start`` comment spawns its session, and a review of its
pull request reaches that session: the dispatches a runner would lease. The same events
delivered by the webhook too are applied once. A restart neither misses nor repeats; GitHub's
rate limits are obeyed.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta

import pytest

from looprelay.adapters.clock import SystemClock
from looprelay.adapters.firestore.poll_cursors import FirestorePollCursors
from looprelay.adapters.github.auth import TokenAuth
from looprelay.adapters.github.rest import GitHubRest
from looprelay.adapters.sqlite.poll_cursors import SqlitePollCursors
from looprelay.config.model import PollConfig, WebhookConfig
from looprelay.core.envelope import Envelope
from looprelay.core.model import RECEIVED
from looprelay.core.poll import LISTINGS
from looprelay.ports import PollCursors
from looprelay.service.poller import Poller, RepositoryPoll
from tests.cloudtasks_dispatcher import CloudTasksDispatcher
from tests.embedded_queue_harness import EmbeddedQueueHarness
from tests.fake_github_poll import user
from tests.fake_harness import wait_until
from tests.rigs import SteppingClock
from tests.routing.conftest import (
    AUTO_LABEL,
    REPO,
    SECRET,
    TOKEN,
    Backend,
    MakeRelay,
    Relay,
    comment_payload,
    issue_payload,
)


@pytest.fixture
def cursors(backend: Backend, request: pytest.FixtureRequest) -> Iterator[PollCursors]:
    """The poll cursors beside ``backend``'s other state."""
    if backend.sqlite_path is not None:
        sqlite = SqlitePollCursors(backend.sqlite_path)
        yield sqlite
        sqlite.close()
    else:
        client = request.getfixturevalue("firestore_client")
        yield FirestorePollCursors(client, collection_prefix=f"{backend.name}_poll_")


# Cloud Tasks' backoff under a loaded machine let 130 comments outlast three minutes (twice in
# five parallel runs; 44 s alone): run apart, as the real CLIs are.
pytestmark = pytest.mark.alone

SETTLE_SECONDS = 180.0
"""How long the tasks of one poll may take to settle: seconds on an idle machine, above a
minute for 130 comments on Firestore on a loaded one (each is drained in turn)."""


@dataclass
class Polling:
    """A poller over the relay's state, and the queue between the two."""

    relay: Relay
    cursors: PollCursors
    queue: EmbeddedQueueHarness
    clock: SteppingClock
    """The poller's and the fake GitHub's time."""
    poller: Poller = field(init=False)
    sent: set[str] = field(default_factory=set)
    settled: dict[str, str] = field(default_factory=dict)
    """Delivery id -> the worker's outcome, for every task sent."""

    def __post_init__(self) -> None:
        self.relay.github.poll.clock = self.clock.now
        self.poller = self.restart()

    def restart(self) -> Poller:
        """A new poller process on the same cursors and ledger."""
        github = GitHubRest(
            api_url=self.relay.github.url, auth=TokenAuth(TOKEN), sleep=lambda _: None
        )
        self.poller = Poller(
            github=github,
            cursors=self.cursors,
            ledger=self.relay.backend.store,
            queue=self.queue.queue,
            clock=self.clock,
            config=PollConfig(repositories=[REPO], overlap_seconds=60),
            webhook=WebhookConfig(),
        )
        return self.poller

    def poll(self) -> RepositoryPoll:
        """A second later (what the test did on GitHub is past), poll once, then push every
        new task to the worker at once with Cloud Tasks' retries: the worker's inbox, not the
        order of the pushes, keeps their order. Returns once the ledger settled them all."""
        self.clock.advance(1)
        [report] = self.poller.run()
        fresh = {name: body for name, body in self.queue.held().items() if name not in self.sent}
        ids = {name: Envelope.model_validate_json(body).delivery_id for name, body in fresh.items()}
        if not ids:
            return report
        dispatcher = CloudTasksDispatcher(worker_url=self.relay.url, token=SECRET)
        try:
            for name, body in fresh.items():
                dispatcher.push(name, {"httpRequest": {"body": base64.b64encode(body).decode()}})
                self.sent.add(name)
            settled = wait_until(
                lambda: self._outcomes(ids.values()),
                seconds=SETTLE_SECONDS,
                what="every polled delivery settled",
            )
        finally:
            dispatcher.stop()  # a push waiting out Retry-After finds its delivery settled
        self.settled.update(settled)
        return report

    def _outcomes(self, delivery_ids: Iterable[str]) -> dict[str, str] | None:
        """Each delivery's outcome in the ledger, or None while one is unsettled."""
        outcomes = {}
        for delivery_id in delivery_ids:
            record = self.relay.backend.store.get_delivery(delivery_id)
            if record is None or record.outcome == RECEIVED:
                return None
            outcomes[delivery_id] = record.outcome
        return outcomes


@pytest.fixture
def polling(
    relay: MakeRelay, cursors: PollCursors, embedded_queue_harness: EmbeddedQueueHarness
) -> Polling:
    made = relay()
    made.github.poll.repository = REPO
    return Polling(made, cursors, embedded_queue_harness, SteppingClock(SystemClock().now()))


def test_a_label_a_comment_and_a_review_reach_the_session_with_no_webhook(
    polling: Polling,
) -> None:
    fake, relay = polling.relay.github.poll, polling.relay
    fake.open_issue(1)
    fake.open_issue(2, pull=True, title="Fix the bug").head_ref = "issue-1-fix"
    assert polling.poll().queued == 0  # first sight: what is there already is no news

    fake.label(1, AUTO_LABEL)
    polling.poll()
    assert relay.must_item(1).control == "armed"

    comment_id = fake.comment(1, "Ready when you are: the-loop start")
    polling.poll()
    [spawn] = relay.dispatches(1, delivery_id=f"poll-comment-{comment_id}")
    assert (spawn.kind, spawn.status, spawn.comment_id) == ("spawn", "pending", comment_id)
    assert "the-loop start" in spawn.prompt

    review_id = fake.review(2, "Looks right, but rename the helper", state="CHANGES_REQUESTED")
    polling.poll()
    assert polling.settled[f"poll-review-{review_id}"] == "dispatched"
    [delivered] = [d for d in relay.dispatches(1) if d.delivery_id == f"poll-review-{review_id}"]
    assert delivered.kind == "deliver" and "rename the helper" in delivered.prompt


def test_a_pull_request_opened_closing_the_issue_is_linked_to_its_work_item(
    polling: Polling,
) -> None:
    fake, relay = polling.relay.github.poll, polling.relay
    fake.open_issue(1)
    polling.poll()
    relay.given_armed(1)

    fake.open_issue(3, pull=True, title="The fix", body="Closes #1")
    polling.poll()

    opened = [d for d in polling.settled if d.startswith("poll-opened-")]
    assert len(opened) == 1
    assert relay.must_item(1).pull_requests == [f"github:{REPO}#3"]


def test_a_poll_with_nothing_new_is_answered_304_and_queues_nothing(polling: Polling) -> None:
    fake = polling.relay.github.poll
    fake.open_issue(1)
    polling.poll()
    fake.comment(1, "hello")
    assert polling.poll().queued == 1
    polling.clock.advance(61)  # quiet for the overlap: each listing is asked with its ETag
    assert polling.poll().queued == 0
    before = fake.not_modified

    again = polling.poll()
    assert (again.queued, again.unchanged) == (0, len(LISTINGS))
    assert fake.not_modified - before == len(LISTINGS)
    conditional = polling.relay.github.calls("GET", r"/issues/comments$")[-1]
    assert conditional.headers["if-none-match"].startswith('"')


@pytest.mark.timeout(2 * SETTLE_SECONDS)
def test_every_page_is_read_and_a_restart_neither_misses_nor_repeats(polling: Polling) -> None:
    fake = polling.relay.github.poll
    fake.open_issue(1)
    polling.poll()
    ids = [fake.comment(1, f"note {n}") for n in range(130)]  # two pages of 100
    assert polling.poll().queued == 130
    pages = polling.relay.github.calls("GET", r"/issues/comments$")
    assert any(call.query.get("page") == ["2"] for call in pages)

    later = fake.comment(1, "written while the poller was down")
    polling.restart()
    report = polling.poll()
    assert report.queued == 1  # the overlap lists the earlier ones again; none is queued
    assert set(polling.settled) >= {f"poll-comment-{i}" for i in [*ids, later]}
    assert len([d for d in polling.settled if d.startswith("poll-comment-")]) == 131


def test_a_webhook_delivery_of_a_polled_comment_is_applied_once(polling: Polling) -> None:
    fake, relay = polling.relay.github.poll, polling.relay
    fake.open_issue(1)
    polling.poll()
    relay.given_armed(1)
    comment_id = fake.comment(1, "the-loop start")
    polling.poll()
    assert polling.settled[f"poll-comment-{comment_id}"] == "dispatched"

    webhook = relay.send("issue_comment", comment_payload("the-loop start", comment_id=comment_id))
    assert webhook.answer["outcome"] == "ignored:same-event"
    assert [d.kind for d in relay.dispatches(1)] == ["spawn"]


def test_a_polled_label_the_webhook_delivered_first_is_applied_once(polling: Polling) -> None:
    fake, relay = polling.relay.github.poll, polling.relay
    issue = fake.open_issue(1)
    polling.poll()
    fake.label(1, AUTO_LABEL)
    [event] = fake.events
    data = issue_payload("labeled", labels=(AUTO_LABEL,), label=AUTO_LABEL)
    data["issue"]["updated_at"] = event["created_at"]  # the webhook's issue is as of the change
    data["sender"] = user("codertocat")
    assert relay.send("issues", data).answer["outcome"] != "ignored:same-event"
    version = relay.must_item(1).version

    polling.poll()
    assert polling.settled[f"poll-event-{event['id']}"] == "ignored:same-event"
    assert relay.must_item(1).version == version
    assert issue.labels == [AUTO_LABEL]


def test_a_spent_rate_limit_stops_the_polls_until_its_reset(polling: Polling) -> None:
    fake, github = polling.relay.github.poll, polling.relay.github
    fake.open_issue(1)
    polling.poll()
    fake.quota = 0
    fake.comment(1, "not yet")

    limited = polling.poll()
    assert "rate" in limited.error and limited.retry_at is not None
    assert limited.retry_at - polling.clock.now() > timedelta(minutes=30)  # x-ratelimit-reset
    calls = len(github.requests)
    skipped = polling.poll()
    assert skipped.skipped and len(github.requests) == calls  # no call made while limited
    cursor = polling.cursors.get_poll_cursor(REPO, "issues")
    assert cursor is not None and cursor.retry_at == limited.retry_at and cursor.error


def test_a_secondary_limit_asking_to_retry_after_backs_off(polling: Polling) -> None:
    fake, github = polling.relay.github.poll, polling.relay.github
    fake.open_issue(1)
    polling.poll()
    github.script(
        match=r"GET .*/issues/events",
        status=403,
        headers={"Retry-After": "90"},
        body={"message": "You have exceeded a secondary rate limit."},
    )
    comment_id = fake.comment(1, "after the limit")

    limited = polling.poll()
    assert limited.retry_at is not None and limited.queued == 0
    wait = limited.retry_at - polling.clock.now()
    assert wait == timedelta(seconds=90)
    assert len(github.calls("GET", r"/issues/events$")) == 2  # asked once, not retried
    assert f"poll-comment-{comment_id}" not in polling.settled
