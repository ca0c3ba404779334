"""Order: a work item's comments reach its session in the order GitHub created them.

The whole path runs for real on each store: signed webhooks into ``Ingress``, the embedded
queue with four dispatchers POSTing to the worker over HTTP, the router, and the lease desk a
runner takes its dispatches from. Fifty comments are made on one issue a few milliseconds
apart (within one second, as GitHub's ``created_at`` sees it: their ids order them), and the
runner must receive them in that order. Every delivery then arrives again, in a random order:
nothing is applied twice. A delivery that keeps failing (a poison delivery) holds the later
ones back for ``routing.orderWaitSeconds`` only; then they go ahead, in order, and an event
says which delivery they went ahead of.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import random
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests

from looprelay.adapters.clock import SystemClock
from looprelay.adapters.gcp.cloud_tasks import CloudTasksQueue
from looprelay.adapters.github.auth import TokenAuth
from looprelay.adapters.github.rest import GitHubRest
from looprelay.adapters.shared_secret_auth import SharedSecretAuthenticator
from looprelay.adapters.sqlite.queue import SqliteQueue
from looprelay.app.asgi import Handler
from looprelay.app.ingress_http import webhook_handler
from looprelay.app.messages import Request, Response
from looprelay.app.worker_http import worker_handler
from looprelay.config.model import EmbeddedQueueConfig, RetryConfig, RunnersConfig, WebhookConfig
from looprelay.config.order import order_rules
from looprelay.config.routing import TemplateSource, routing_policy
from looprelay.core.envelope import Envelope
from looprelay.core.model import DeliveryRecord, DispatchRecord, RunnerRecord
from looprelay.errors import Transient
from looprelay.ports import Queue
from looprelay.service.inbox import ARRIVED_LATE, WENT_AHEAD
from looprelay.service.ingress import Ingress
from looprelay.service.lease_desk import LeaseDesk
from looprelay.service.results import Progress
from looprelay.service.route import Router
from looprelay.service.worker import Outcome, Worker
from looprelay.wire.runner_api import ResultBody
from tests.cloudtasks_dispatcher import CloudTasksDispatcher
from tests.cloudtasks_recorder import CloudTasksRecorder, recorder_config
from tests.fake_github import FakeGitHub
from tests.fake_harness import wait_until
from tests.routing.conftest import (
    REPO,
    SECRET,
    TOKEN,
    Backend,
    MakeRelay,
    Relay,
    _Switchboard,
    comment_payload,
    issue_payload,
    review_comment_payload,
    user,
)
from tests.samples import payload

WEBHOOK_SECRET = b"order-webhook-secret"
DISPATCHERS = 4
COMMENTS = 50
ORDER_WAIT_SECONDS = 1.0
DEADLINE_SECONDS = 60.0


@dataclass
class Ordered:
    """A deployment that keeps order: ingress, the embedded queue and the worker over HTTP."""

    relay: Relay
    ingress: Ingress
    worker_url: str

    def comment(
        self, index: int, *, created_at: datetime, send: bool = True
    ) -> tuple[int, str, dict[str, Any]]:
        """Make comment ``index`` on issue 1 on the fake GitHub and send its signed webhook
        (unless not ``send``); return its comment id, delivery id and payload."""
        body = f"comment {index:02d}"
        comment_id = self.relay.github.add_comment(body, number=1, repository=REPO)
        data = comment_payload(body, comment_id=comment_id)
        data["comment"]["created_at"] = created_at.strftime("%Y-%m-%dT%H:%M:%SZ")
        delivery_id = f"order-{index:04d}"
        if send:
            self.send("issue_comment", data, delivery_id)
        return comment_id, delivery_id, data

    def wait_settled(self, delivery_ids: list[str]) -> dict[str, DeliveryRecord]:
        def settled() -> dict[str, DeliveryRecord] | None:
            records = {d: self.relay.backend.store.get_delivery(d) for d in delivery_ids}
            done = {d: r for d, r in records.items() if r is not None and r.settled}
            return done if len(done) == len(delivery_ids) else None

        found: dict[str, DeliveryRecord] = wait_until(
            settled, seconds=DEADLINE_SECONDS, what=f"{len(delivery_ids)} deliveries settled"
        )
        return found

    def send_at_once(self, sent: list[tuple[str, str, dict[str, Any]]], *, seed: int) -> None:
        """Send each ``(event, delivery id, payload)`` of ``sent`` from a thread of its own,
        all at once, in an order shuffled by ``seed``."""
        shuffled = list(sent)
        random.Random(seed).shuffle(shuffled)
        with ThreadPoolExecutor(len(shuffled)) as pool:
            list(pool.map(lambda one: self.send(one[0], one[2], one[1]), shuffled))

    def redeliver(self, record: DeliveryRecord) -> dict[str, Any]:
        """The queue's task of ``record`` once more, straight to the worker: its answer."""
        answer = requests.post(
            self.worker_url,
            data=record.envelope.encode(),
            headers={"Authorization": f"Bearer {SECRET}"},
            timeout=30,
        )
        assert answer.status_code == 200, answer.text
        result: dict[str, Any] = answer.json()
        return result

    def send(self, event: str, data: dict[str, Any], delivery_id: str) -> None:
        """Send one signed webhook of ``event`` to ingress."""
        answer = webhook_handler(self.ingress)(_signed(data, delivery_id, event=event))
        assert answer.status == 202, answer.body

    def pasted(self, runner: RunnerRecord) -> list[int]:
        """What ``runner`` receives, in order: the comment of each delivery into its session
        it leases, until there is none (each reported before the next poll)."""
        return [dispatch.comment_id or 0 for dispatch in self.leased(runner)]

    def handed(self, runner: RunnerRecord) -> list[str]:
        """The delivery of each dispatch into its session ``runner`` leases, in order."""
        return [dispatch.delivery_id for dispatch in self.leased(runner)]

    def leased(self, runner: RunnerRecord) -> list[DispatchRecord]:
        """Every delivery into its session ``runner`` leases, in order, until there is none
        (each reported before the next poll)."""
        backend = self.relay.backend
        desk = LeaseDesk(
            registry=backend.runners,
            work_items=backend.work_items,
            store=backend.store,
            clock=self.relay.clock,
            config=RunnersConfig(),
            progress=Progress(
                work_items=backend.work_items,
                store=backend.store,
                github=None,
                clock=self.relay.clock,
            ),
        )
        received = []
        while (leased := desk.try_lease(runner)) is not None:
            if leased.kind == "deliver":
                received.append(leased)
            status = "delivered" if leased.kind == "deliver" else "spawned"
            desk.report(runner, ResultBody(dispatch_id=leased.dispatch_id, status=status))
        return received


def _signed(data: dict[str, Any], delivery_id: str, *, event: str) -> Request:
    body = json.dumps(data).encode()
    digest = hmac.new(WEBHOOK_SECRET, body, hashlib.sha256).hexdigest()
    headers = {
        "content-type": "application/json",
        "x-github-event": event,
        "x-github-delivery": delivery_id,
        "x-hub-signature-256": f"sha256={digest}",
        "content-length": str(len(body)),
    }
    return Request(method="POST", path="/webhook", headers=headers, body=body)


def _poisoned(router: Router, poison: frozenset[str]) -> Callable[[Envelope, Any], Outcome]:
    """The router, except that the deliveries in ``poison`` fail every time, as one would
    whose store write keeps timing out."""

    def handle(envelope: Envelope, record: DeliveryRecord) -> Outcome:
        if envelope.delivery_id in poison:
            raise Transient(f"{envelope.delivery_id} is poisoned for this test")
        return router(envelope, record)

    return handle


MakeOrdered = Callable[..., Ordered]


QUEUES = ["embedded", "cloudtasks"]


@pytest.fixture(params=QUEUES)
def ordered(
    request: pytest.FixtureRequest,
    relay: MakeRelay,
    backend: Backend,
    fake_github: FakeGitHub,
    switchboard: _Switchboard,
    tmp_path: Path,
) -> Iterator[MakeOrdered]:
    """``ordered(poison=..., **routing)``: a deployment over ``backend`` on the real clock,
    its tasks carried by the embedded queue (four dispatchers) or by Cloud Tasks (each task
    pushed at once, retried after 1 s x 2^n: ``tests/cloudtasks_dispatcher.py``)."""
    mounted: list[str] = []
    closing: list[Callable[[], None]] = []

    def _make(poison: frozenset[str] = frozenset(), **routing: Any) -> Ordered:
        base = relay(**routing)
        clock = SystemClock()
        router = Router(
            store=backend.store,
            work_items=backend.work_items,
            runners=backend.runners,
            github=GitHubRest(api_url=fake_github.url, auth=TokenAuth(TOKEN)),
            policy=routing_policy(base.config.routing),
            templates=TemplateSource(base.config.routing),
            clock=clock,
        )
        # The worker queues its wakes on the queue that brings it its tasks, which needs the
        # worker's URL first: the mount hands requests on to the worker made next.
        handlers: list[Handler] = []

        def to_worker(request: Request) -> Response:
            return handlers[0](request)

        url = switchboard.mount(to_worker)
        mounted.append(url)
        queue = _queue(request.param, url, tmp_path / f"queue-{len(mounted)}.db", closing)
        worker = Worker(
            store=backend.store,
            authenticator=SharedSecretAuthenticator(SECRET),
            clock=clock,
            handler=_poisoned(router, poison),
            order_wait=timedelta(seconds=ORDER_WAIT_SECONDS),
            order_rules=order_rules(base.config.routing),
            wakes=queue,
        )
        handlers.append(worker_handler(worker))
        ingress = Ingress(secrets=[WEBHOOK_SECRET], queue=queue, config=WebhookConfig())
        return Ordered(base, ingress, url)

    yield _make
    for close in closing:
        close()
    for url in mounted:
        switchboard.unmount(url)


def _queue(kind: str, worker_url: str, path: Path, closing: list[Callable[[], None]]) -> Queue:
    if kind == "embedded":
        embedded = SqliteQueue(
            path,
            retry=RetryConfig(min_backoff_seconds=0.05, max_backoff_seconds=0.2, max_attempts=500),
            settings=EmbeddedQueueConfig(concurrency=DISPATCHERS),
        )
        embedded.start(worker_url=worker_url, auth_token=SECRET)
        closing.append(embedded.close)
        return embedded
    recorder = CloudTasksRecorder()
    recorder.start()
    dispatcher = CloudTasksDispatcher(worker_url=worker_url, token=SECRET)
    recorder.on_created.append(dispatcher.push)
    closing.extend([dispatcher.stop, recorder.stop])
    return CloudTasksQueue.from_config(recorder_config(recorder, worker_url=worker_url))


def _started(deployment: Ordered) -> RunnerRecord:
    """Issue 1 started, its session live on a runner: return the runner."""
    deployment.relay.start(1)
    return deployment.relay.runner_holds(1, workspace=False)


class TestOrder:
    def test_comments_reach_the_session_in_creation_order_and_redeliveries_change_nothing(
        self, ordered: MakeOrdered
    ) -> None:
        deployment = ordered()
        runner = _started(deployment)
        created = datetime.now(UTC).replace(microsecond=0)
        sent = [deployment.comment(index, created_at=created) for index in range(COMMENTS)]
        ledger = deployment.wait_settled([delivery for _, delivery, _ in sent])
        assert {record.outcome for record in ledger.values()} == {"dispatched"}

        assert deployment.pasted(runner) == [comment for comment, _, _ in sent]

        again = list(ledger.values())
        random.Random(14).shuffle(again)

        with ThreadPoolExecutor(DISPATCHERS) as pool:
            answers = list(pool.map(deployment.redeliver, again))
        assert {answer["status"] for answer in answers} == {"already-settled"}
        assert len(deployment.relay.dispatches(1)) == 1 + COMMENTS  # the spawn and one each
        assert deployment.pasted(runner) == []

    def test_a_poison_delivery_holds_the_later_ones_back_only_for_the_order_wait(
        self, ordered: MakeOrdered
    ) -> None:
        deployment = ordered(poison=frozenset({"order-0002"}))
        runner = _started(deployment)
        created = datetime.now(UTC).replace(microsecond=0)
        sent = [deployment.comment(index, created_at=created) for index in range(5)]
        healthy = [(c, delivery) for c, delivery, _ in sent if delivery != "order-0002"]
        deployment.wait_settled([delivery for _, delivery in healthy])

        assert deployment.pasted(runner) == [comment for comment, _ in healthy]
        poison = deployment.relay.backend.store.get_delivery("order-0002")
        assert poison is not None and not poison.settled
        went_ahead = deployment.relay.events(WENT_AHEAD)
        assert {event.delivery_id for event in went_ahead} == {"order-0003", "order-0004"}
        assert {tuple(event.data["ahead_of"]) for event in went_ahead} == {("order-0002",)}
        first = min(went_ahead, key=lambda event: event.at)
        waited = (first.at - poison.received_at).total_seconds()
        assert waited >= ORDER_WAIT_SECONDS, f"went ahead after {waited:.2f} s"

    def test_a_burst_sent_at_once_in_any_order_reaches_the_session_in_creation_order(
        self, ordered: MakeOrdered
    ) -> None:
        deployment = ordered()
        runner = _started(deployment)
        created = datetime.now(UTC).replace(microsecond=0)
        made = [deployment.comment(index, created_at=created, send=False) for index in range(15)]
        deployment.send_at_once([("issue_comment", d, data) for _, d, data in made], seed=25)
        deployment.wait_settled([delivery for _, delivery, _ in made])

        assert deployment.pasted(runner) == [comment for comment, _, _ in made]
        assert deployment.relay.events(WENT_AHEAD) == []  # waiting for one's turn is no failure
        assert deployment.relay.events(ARRIVED_LATE) == []  # nor is a run's creation order

    def test_a_comment_made_just_after_a_label_change_comes_after_it(
        self, ordered: MakeOrdered
    ) -> None:
        deployment = ordered()
        runner = _started(deployment)
        # GitHub's created_at has whole seconds: the comment's reads earlier than the label's
        # receipt, as in issue 25, where the comment was pasted first.
        second = datetime.now(UTC).replace(microsecond=0)
        labeled = issue_payload("labeled", labels=("bug",), label="bug")
        deployment.send("issues", labeled, "order-label")  # received: ingress answered 202
        _, comment, _ = deployment.comment(1, created_at=second)  # made and received after it
        deployment.wait_settled(["order-label", comment])

        assert deployment.handed(runner) == ["order-label", comment]


REVIEW_ID = 88001


def _review(deployment: Ordered, comments: int) -> list[tuple[str, str, dict[str, Any]]]:
    """A review of PR 2 with ``comments`` inline comments on the fake GitHub: each delivery's
    event, id and payload, the review's last (as GitHub sends it, after its comments)."""
    made = []
    for index in range(comments):
        body = f"inline note {index}"
        comment_id = deployment.relay.github.add_comment(
            body, number=2, kind="review", repository=REPO
        )
        data = review_comment_payload(body, comment_id=comment_id, pr_body="Closes #1")
        data["comment"].update(
            pull_request_review_id=REVIEW_ID, path=f"src/part_{index}.py", line=10 + index
        )
        made.append(("pull_request_review_comment", f"review-part-{index}", data))
    review = payload("pull_request_review.submitted")
    review["review"].update(id=REVIEW_ID, body="Two things before this merges.")
    review["review"]["user"] = review["sender"] = user("Codertocat")
    review["repository"]["full_name"] = REPO
    review["pull_request"]["number"] = 2
    review["pull_request"]["body"] = "Closes #1"
    made.append(("pull_request_review", "review-body", review))
    return made


class TestReviewTurn:
    def test_a_review_and_its_inline_comments_reach_the_session_as_one_turn(
        self, ordered: MakeOrdered
    ) -> None:
        deployment = ordered()
        runner = _started(deployment)
        deployment.relay.link_pull_request(2, issue=1)
        deployment.leased(runner)  # the pull request's opening, delivered
        made = _review(deployment, 3)
        deployment.send_at_once(made, seed=28)
        ledger = deployment.wait_settled([delivery for _, delivery, _ in made])

        [turn] = deployment.leased(runner)
        assert turn.delivery_id == "review-body"
        prompt = turn.prompt
        places = [prompt.index("Two things before this merges.")]
        places += [prompt.index(f"inline note {index}") for index in range(3)]
        assert places == sorted(places)  # the review's body, then its comments in order
        for index in range(3):
            assert f'"path": "src/part_{index}.py"' in prompt
            assert f'"line": {10 + index}' in prompt
        begin, end = prompt.index("BEGIN UNTRUSTED"), prompt.index("END UNTRUSTED")
        assert all(begin < place < end for place in places)
        assert {record.outcome for record in ledger.values()} == {"dispatched"}
        joined = [ledger[f"review-part-{index}"].detail for index in range(3)]
        assert joined == ["one turn with delivery review-body"] * 3

        answers = [deployment.redeliver(record) for record in ledger.values()]
        assert {answer["status"] for answer in answers} == {"already-settled"}
        assert deployment.leased(runner) == []  # nothing more to paste

    def test_with_burst_turns_one_authors_burst_of_comments_is_one_turn(
        self, ordered: MakeOrdered
    ) -> None:
        deployment = ordered(comment_burst_turns=True)
        runner = _started(deployment)
        created = datetime.now(UTC).replace(microsecond=0)
        made = [deployment.comment(index, created_at=created, send=False) for index in range(5)]
        deployment.send_at_once([("issue_comment", d, data) for _, d, data in made], seed=7)
        ledger = deployment.wait_settled([delivery for _, delivery, _ in made])

        [turn] = deployment.leased(runner)
        assert turn.delivery_id == made[0][1]  # led by the first made, the others in order
        places = [turn.prompt.index(f"comment {index:02d}") for index in range(5)]
        assert places == sorted(places)
        assert {record.outcome for record in ledger.values()} == {"dispatched"}
