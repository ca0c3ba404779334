"""Wakes, on each store: a turn not ready yet ends its attempt at once, and the wake the worker
queued on the real embedded queue hands it off once it is ready.

Each test drives the worker as the queue does (a task's body in, its settlement or
``Transient`` out) on a clock the test moves, and reads what the queue holds.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from looprelay.adapters.clock import SystemClock
from looprelay.adapters.shared_secret_auth import SharedSecretAuthenticator
from looprelay.adapters.sqlite.queue import QueuedTask, SqliteQueue
from looprelay.app.messages import Request
from looprelay.app.worker_http import worker_handler
from looprelay.config.model import EmbeddedQueueConfig, RetryConfig
from looprelay.core.envelope import Comment, Envelope, Issue, Repository, order_key
from looprelay.core.model import DeliveryRecord
from looprelay.core.order import COMMENT_WINDOW
from looprelay.core.wake import WAKE_MARGIN, wake_body, wake_task_name
from looprelay.errors import Transient
from looprelay.ports import Clock, Store
from looprelay.service.worker import Outcome, Settlement, Worker

SECRET = "wake-secret"
HEADERS = {"authorization": f"Bearer {SECRET}"}
GROUP = "octo/demo#7"


class MovableClock:
    """The ``Clock`` port at a moment the test moves."""

    def __init__(self, at: datetime) -> None:
        self.at = at

    def now(self) -> datetime:
        return self.at


class Handed:
    """The worker's handler: records what it is handed, fails while ``failing``."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.failing = False

    def __call__(self, envelope: Envelope, _record: DeliveryRecord) -> Outcome:
        if self.failing:
            raise Transient("the session store times out")
        self.calls.append(envelope.delivery_id)
        return Outcome("dispatched", "")


def _comment(index: int, at: datetime) -> bytes:
    """A new comment on octo/demo#7 received by the webhook ``at``: its task's body."""
    envelope = Envelope(
        delivery_id=f"d-{index}",
        event="issue_comment",
        action="created",
        repository=Repository(full_name="octo/demo"),
        issue=Issue(number=7),
        comment=Comment(id=1000 + index, body=f"comment {index}", created_at=at),
        order_key=order_key(at),
    )
    return envelope.model_dump_json().encode()


@pytest.fixture
def queue(tmp_path: Path) -> Iterator[SqliteQueue]:
    """The embedded queue, not dispatching: the test reads its tasks and plays the wakes."""
    embedded = SqliteQueue(
        tmp_path / "queue.db",
        retry=RetryConfig(),
        settings=EmbeddedQueueConfig(concurrency=1),
    )
    yield embedded
    embedded.close()


def _worker(store: Store, queue: SqliteQueue | None, clock: Clock, handler: Handed) -> Worker:
    return Worker(
        store=store,
        authenticator=SharedSecretAuthenticator(SECRET),
        clock=clock,
        handler=handler,
        wakes=queue,
    )


def _wakes(queue: SqliteQueue) -> list[QueuedTask]:
    return [task for task in queue.list_tasks() if task.name.startswith("wk-")]


def _settled(store: Store, delivery_id: str) -> str | None:
    record = store.get_delivery(delivery_id)
    return record.outcome if record is not None and record.settled else None


def _now() -> datetime:
    # The embedded queue stamps due times on the real clock: the test's starts there.
    return datetime.now(UTC)


@dataclass
class Waiting:
    """A worker whose comment 1 waits for its wake: the worker, its clock and handler, when
    the comment is ready, and the wake's task."""

    worker: Worker
    clock: MovableClock
    handed: Handed
    until: datetime
    wake: QueuedTask


def _waiting(store: Store, queue: SqliteQueue) -> Waiting:
    clock, handed = MovableClock(_now()), Handed()
    worker = _worker(store, queue, clock, handed)
    until = worker.settle(HEADERS, _comment(1, clock.at)).waiting_until
    assert until is not None
    [wake] = _wakes(queue)
    return Waiting(worker, clock, handed, until, wake)


class TestALoneComment:
    def test_its_attempt_ends_at_once_and_its_wake_is_due_when_it_is_ready(
        self, store: Store, queue: SqliteQueue
    ) -> None:
        clock, handed = MovableClock(_now()), Handed()
        worker = _worker(store, queue, clock, handed)

        answer = worker_handler(worker)(
            Request(method="POST", path="/", headers=HEADERS, body=_comment(1, clock.at))
        )

        ready = clock.at + COMMENT_WINDOW
        assert answer.status == 200
        assert json.loads(answer.body) == {"status": "waiting", "until": ready.isoformat()}
        assert handed.calls == [] and _settled(store, "d-1") is None
        [wake] = _wakes(queue)
        assert wake.name == wake_task_name(GROUP, ready)
        assert wake.eta == pytest.approx((ready + WAKE_MARGIN).timestamp(), abs=0.001)

    def test_its_wake_hands_it_off_once_it_is_ready(self, store: Store, queue: SqliteQueue) -> None:
        waiting = _waiting(store, queue)

        waiting.clock.at = waiting.until + WAKE_MARGIN
        assert waiting.worker.settle(HEADERS, waiting.wake.body) == Settlement(None)

        assert waiting.handed.calls == ["d-1"]
        assert _settled(store, "d-1") == "dispatched"
        assert waiting.worker.settle(
            HEADERS, _comment(1, waiting.clock.at)
        ).already  # the queue's retry

    def test_two_comments_of_one_run_are_handed_off_in_order_by_the_last_wake(
        self, store: Store, queue: SqliteQueue
    ) -> None:
        clock, handed = MovableClock(_now()), Handed()
        worker = _worker(store, queue, clock, handed)
        first = worker.settle(HEADERS, _comment(1, clock.at))
        clock.at += COMMENT_WINDOW / 2
        second = worker.settle(HEADERS, _comment(2, clock.at))
        assert first.waiting_until is not None and second.waiting_until is not None
        assert second.waiting_until > first.waiting_until  # the run goes on: it waits longer

        clock.at = first.waiting_until + WAKE_MARGIN
        early, later = sorted(_wakes(queue), key=lambda task: task.eta)
        assert worker.settle(HEADERS, early.body).waiting_until == second.waiting_until
        assert handed.calls == []
        clock.at = second.waiting_until + WAKE_MARGIN
        assert worker.settle(HEADERS, later.body) == Settlement(None)
        assert handed.calls == ["d-1", "d-2"]


class TestAWakeIsRetried:
    def test_while_what_it_hands_off_keeps_failing(self, store: Store, queue: SqliteQueue) -> None:
        waiting = _waiting(store, queue)
        waiting.clock.at = waiting.until + WAKE_MARGIN

        waiting.handed.failing = True
        answer = worker_handler(waiting.worker)(
            Request(method="POST", path="/", headers=HEADERS, body=waiting.wake.body)
        )
        assert answer.status == 503  # the queue tries the waiting.wake again: nothing else would
        assert _settled(store, "d-1") is None

        waiting.handed.failing = False
        assert waiting.worker.settle(HEADERS, waiting.wake.body) == Settlement(None)
        assert _settled(store, "d-1") == "dispatched"

    def test_when_another_attempt_holds_the_inbox(self, store: Store, queue: SqliteQueue) -> None:
        waiting = _waiting(store, queue)
        waiting.clock.at = waiting.until + WAKE_MARGIN
        held = store.take_inbox(
            GROUP,
            holder="another",
            now=waiting.clock.at,
            until=waiting.clock.at + timedelta(seconds=15),
        )
        assert held is not None

        answer = worker_handler(waiting.worker)(
            Request(method="POST", path="/", headers=HEADERS, body=waiting.wake.body)
        )
        # Knocked on, the holder lists again before it releases; the wake comes back after
        # the holder's lease (a dead holder's lapses), not on the queue's backoff, which a
        # long drain would outlast attempt after attempt.
        assert (answer.status, answer.headers.get("retry-after")) == (503, "15")
        assert waiting.handed.calls == []

        waiting.clock.at += timedelta(seconds=16)  # its holder died: its lease lapses
        assert waiting.worker.settle(HEADERS, waiting.wake.body) == Settlement(None)
        assert waiting.handed.calls == ["d-1"]

    def test_when_it_came_early_rather_than_queue_itself_again(
        self, store: Store, queue: SqliteQueue
    ) -> None:
        # A queue whose clock is behind the worker's: the wake's own name is taken until long
        # after it is done, so queueing "again" would queue nothing.
        waiting = _waiting(store, queue)

        waiting.clock.at = waiting.until - timedelta(seconds=0.5)
        with pytest.raises(Transient) as raised:
            waiting.worker.settle(HEADERS, waiting.wake.body)
        assert "came early" in str(raised.value.__cause__)
        assert waiting.handed.calls == [] and len(_wakes(queue)) == 1

        waiting.clock.at = waiting.until + WAKE_MARGIN
        assert waiting.worker.settle(HEADERS, waiting.wake.body) == Settlement(None)
        assert waiting.handed.calls == ["d-1"]


class TestWithoutAWake:
    def test_a_queue_that_cannot_take_the_wake_leaves_the_attempt_to_wait(
        self, store: Store, queue: SqliteQueue
    ) -> None:
        queue.close()  # enqueue now raises Transient, as an unreachable queue does
        handed = Handed()
        worker = _worker(store, queue, SystemClock(), handed)

        settled = worker.settle(HEADERS, _comment(1, datetime.now(UTC)))

        assert settled == Settlement("dispatched")
        assert handed.calls == ["d-1"]

    def test_a_wake_for_an_empty_inbox_is_done(self, store: Store, queue: SqliteQueue) -> None:
        handed = Handed()
        worker = _worker(store, queue, SystemClock(), handed)

        assert worker.settle(HEADERS, wake_body(GROUP, datetime.now(UTC))) == Settlement(None)
        assert handed.calls == []
