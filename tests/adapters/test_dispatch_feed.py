"""The cloud runner API's change feed on the Firestore emulator: one listener wakes waiting
polls, an idle poll reads nothing, a dropped listener is opened again, and polls still find
work while the feed is down.

The runner API is served over real HTTP as in ``tests/test_leases.py``, with the feed wired as
``app.cloud.build_runner_api`` wires it. The stores read through a client whose RPCs are
counted (``bench/storecount.py``); the feed listens on a client of its own.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
import requests
from google.cloud import firestore

from bench.storecount import OpCounts, count_client
from looprelay.adapters.firestore.dispatch_feed import FirestoreDispatchFeed
from looprelay.adapters.firestore.runners import FirestoreRunnerRegistry
from looprelay.adapters.firestore.store import FirestoreStore
from looprelay.adapters.firestore.work_items import FirestoreWorkItemStore
from looprelay.config.model import RunnersConfig
from looprelay.service.lease_desk import FEED_DOWN_LOOK_SECONDS
from looprelay.service.waker import DispatchWaker
from tests.dispatches import make_dispatch, save_with_own_session
from tests.fake_github import FakeGitHub
from tests.fake_harness import wait_until
from tests.firestore_emulator import PROJECT
from tests.rigs import Stores
from tests.test_leases import HTTP_TIMEOUT, Desk, Runner, serve_desk

pytestmark = pytest.mark.firestore

LONG_WAIT = 50.0
"""A poll's wait: longer than any wake-up the tests expect, so an answer before it ends
came from a wake-up."""
WOKEN_WITHIN = 20.0
"""Generous deadline for a wake-up (a push takes milliseconds on the emulator)."""
AUTHENTICATION_READS = {"doc.reads": 1}
"""What one poll reads when no dispatch is for it: its runner document, to check the secret."""


@dataclass
class Cloud:
    """The runner API as one cloud instance serves it, and what its stores read."""

    desk: Desk
    feed: FirestoreDispatchFeed
    counts: OpCounts
    elsewhere: FirestoreWorkItemStore
    """The same dispatches, written through an uncounted client (another function's)."""

    def poll_in_background(self, pool: ThreadPoolExecutor, runner: Runner) -> Future[Any]:
        """Start a long poll and return once it has been authenticated (its one read)."""
        before = self.counts.snapshot().get("doc.reads", 0)
        answer = pool.submit(self.desk.poll, runner, LONG_WAIT)
        wait_until(
            lambda: self.counts.snapshot().get("doc.reads", 0) > before,
            what="the poll to reach the runner API",
        )
        return answer

    def open_count(self) -> int:
        return len(self.feed.open_dispatches() or ())


def _cloud(
    firestore_client: firestore.Client, fake_github: FakeGitHub, *, started: bool
) -> Iterator[Cloud]:
    prefix = f"t{uuid.uuid4().hex[:12]}_"
    counted = firestore.Client(project=PROJECT)
    counts = OpCounts()
    count_client(counted, counts)
    stores = Stores(
        FirestoreRunnerRegistry(counted, collection_prefix=prefix),
        FirestoreWorkItemStore(counted, collection_prefix=prefix),
        FirestoreStore(counted, collection_prefix=prefix),
    )
    waker = DispatchWaker()
    feed = FirestoreDispatchFeed(
        firestore_client, on_change=waker.notify, collection_prefix=prefix, check_seconds=0.1
    )
    if started:
        feed.start()
        wait_until(lambda: feed.open_dispatches() is not None, what="the first push")
    config = RunnersConfig(poll_wait_seconds=55)
    elsewhere = FirestoreWorkItemStore(firestore_client, collection_prefix=prefix)
    try:
        for desk in serve_desk(stores, fake_github, waker=waker, feed=feed, config=config):
            yield Cloud(desk, feed, counts, elsewhere)
    finally:
        feed.close()
        counted.close()


@pytest.fixture
def cloud(firestore_client: firestore.Client, fake_github: FakeGitHub) -> Iterator[Cloud]:
    yield from _cloud(firestore_client, fake_github, started=True)


@pytest.fixture
def feed_down(firestore_client: firestore.Client, fake_github: FakeGitHub) -> Iterator[Cloud]:
    """The same, but the feed never got a listener open (as while Firestore refuses it)."""
    yield from _cloud(firestore_client, fake_github, started=False)


def _leased_soon_after_saving(cloud: Cloud, runner: Runner, number: int) -> float:
    """Start a long poll, then save a dispatch the runner may take; return the seconds from
    the save to the lease (failing the test if the poll got anything else)."""
    with ThreadPoolExecutor(1) as pool:
        answer = cloud.poll_in_background(pool, runner)
        dispatch = cloud.desk.dispatch(number)
        saved = time.monotonic()
        cloud.desk.seed(number, dispatch)
        response: requests.Response = answer.result(timeout=HTTP_TIMEOUT + LONG_WAIT)
        waited = time.monotonic() - saved
    assert response.status_code == 200, response.text
    assert response.json()["dispatch"]["dispatch_id"] == dispatch.dispatch_id
    return waited


def test_a_saved_dispatch_wakes_the_waiting_poll_at_once(cloud: Cloud) -> None:
    runner = cloud.desk.runner("a")
    assert _leased_soon_after_saving(cloud, runner, 1) < WOKEN_WITHIN
    assert cloud.feed.listeners_opened == 1


def test_an_idle_poll_reads_nothing_but_its_runner(cloud: Cloud) -> None:
    """While it waits, a poll costs no read: not when nothing changes, and not when a
    dispatch for another repository is saved (the listener pays one read for it)."""
    runner = cloud.desk.runner("a")
    before, listened = cloud.counts.snapshot(), cloud.feed.reads
    response = cloud.desk.poll(runner, 2.0)
    assert response.status_code == 204
    assert OpCounts.minus(cloud.counts.snapshot(), before) == AUTHENTICATION_READS
    assert cloud.feed.reads == listened

    with ThreadPoolExecutor(1) as pool:
        before = cloud.counts.snapshot()
        answer = pool.submit(cloud.desk.poll, runner, 4.0)
        other = make_dispatch(
            repository="octo/elsewhere", number=9, created_at=cloud.desk.clock.now()
        )
        save_with_own_session(
            cloud.elsewhere,
            repository="octo/elsewhere",
            number=9,
            dispatches=[other],
            now=cloud.desk.clock.now(),
        )
        wait_until(lambda: cloud.open_count() == 1, what="the push of the other dispatch")
        assert answer.result(timeout=HTTP_TIMEOUT).status_code == 204
    assert OpCounts.minus(cloud.counts.snapshot(), before) == AUTHENTICATION_READS
    assert cloud.feed.reads == listened + 1


def test_a_dropped_listener_is_opened_again_and_wakes_polls(cloud: Cloud) -> None:
    runner = cloud.desk.runner("a")
    # What the client library does when the server ends the stream with an error it does
    # not retry: the listener closes for good.
    cloud.feed._watch.close()
    wait_until(
        lambda: cloud.feed.listeners_opened == 2 and cloud.feed.open_dispatches() is not None,
        what="a second listener's first push",
    )
    assert _leased_soon_after_saving(cloud, runner, 2) < WOKEN_WITHIN


def test_while_the_feed_is_down_polls_still_find_work(feed_down: Cloud) -> None:
    runner = feed_down.desk.runner("a")
    assert feed_down.feed.open_dispatches() is None
    waited = _leased_soon_after_saving(feed_down, runner, 3)
    assert waited < FEED_DOWN_LOOK_SECONDS + WOKEN_WITHIN
