"""Pytest plugin: the cloud runner API as one instance serves it, on the Firestore emulator.

The runner API is served over real HTTP as in ``tests/test_leases.py``, with the dispatch feed
and the cache of runners (told by the runner changes feed) wired as
``app.cloud.build_runner_api`` wires them. The stores read
through a client whose RPCs are counted (``bench/storecount.py``), and the registry's calls
are counted too; the listeners have a client of their own.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import pytest
from google.cloud import firestore

from bench.storecount import CountingAdapter, OpCounts, count_client
from looprelay.adapters.firestore.dispatch_feed import FirestoreDispatchFeed
from looprelay.adapters.firestore.runner_changes import FirestoreRunnerChanges
from looprelay.adapters.firestore.runners import FirestoreRunnerRegistry
from looprelay.adapters.firestore.store import FirestoreStore
from looprelay.adapters.firestore.work_items import FirestoreWorkItemStore
from looprelay.config.model import RunnersConfig
from looprelay.core.model import RunnerRecord
from looprelay.service.runner_cache import RunnerRecords
from looprelay.service.waker import DispatchWaker
from tests.fake_github import REPOSITORY, FakeGitHub
from tests.fake_harness import wait_until
from tests.firestore_emulator import PROJECT
from tests.rigs import Stores
from tests.test_leases import Desk, Runner, serve_desk

LONG_WAIT = 50.0
"""A poll's wait: longer than any wake-up the tests expect, so an answer before it ends
came from a wake-up."""
WOKEN_WITHIN = 20.0
"""Generous deadline for a wake-up (a push takes milliseconds on the emulator)."""


class HeardRecords(RunnerRecords):
    """The cache of runners, counting the lookups authentication makes in it: a request
    reached the runner API when one more was made."""

    def __init__(
        self, client: firestore.Client, *, collection_prefix: str, waker: DispatchWaker
    ) -> None:
        self.changes = FirestoreRunnerChanges(
            client, collection_prefix=collection_prefix, check_seconds=0.1
        )
        # As ``app.cloud`` wires it: a change wakes the runner's waiting polls.
        super().__init__(self.changes, told=lambda ids: waker.notify((), runners=ids))
        self._finds = 0
        self._counted = threading.Lock()

    def find(self, runner_id: str) -> RunnerRecord | None:
        with self._counted:
            self._finds += 1
        return super().find(runner_id)

    @property
    def finds(self) -> int:
        with self._counted:
            return self._finds

    def listening(self) -> bool:
        """Whether the changes feed has pushed and is open: ``find`` answers from memory."""
        return self.changes.live()


@dataclass
class Cloud:
    """The runner API as one cloud instance serves it, and what its stores read."""

    desk: Desk
    feed: FirestoreDispatchFeed
    records: HeardRecords
    counts: OpCounts
    elsewhere: Stores
    """The same collections through an uncounted client (another function's, an operator's)."""

    def runner(self, name: str, **heartbeat: Any) -> Runner:
        """Register a runner and send its first heartbeat, as ``Desk.runner``; return once
        the cache holds it as that heartbeat left it (when its feed listens): a poll reads it
        until the push of the heartbeat's change has come."""
        runner = self.desk.runner(name, **heartbeat)
        if self.records.listening():
            repositories = list(heartbeat.get("repositories", (REPOSITORY,)))
            wait_until(
                lambda: (
                    self.desk.poll(runner, 0).status_code in (200, 204)
                    and (held := self.records.find(runner.runner_id)) is not None
                    and held.repositories == repositories
                ),
                what=f"the cache to hold runner {name}",
            )
        return runner

    def poll_in_background(self, pool: ThreadPoolExecutor, runner: Runner) -> Future[Any]:
        """Start a long poll and return once it has been authenticated."""
        before = self.records.finds
        answer = pool.submit(self.desk.poll, runner, LONG_WAIT)
        wait_until(lambda: self.records.finds > before, what="the poll to reach the runner API")
        return answer

    def open_count(self) -> int:
        return len(self.feed.open_dispatches() or ())

    def reads(self) -> int:
        return self.counts.snapshot().get("doc.reads", 0)


def _cloud(
    firestore_client: firestore.Client,
    fake_github: FakeGitHub,
    *,
    feed_started: bool = True,
    records_started: bool = True,
) -> Iterator[Cloud]:
    prefix = f"t{uuid.uuid4().hex[:12]}_"
    counted = firestore.Client(project=PROJECT)
    counts = OpCounts()
    count_client(counted, counts)
    registry = FirestoreRunnerRegistry(counted, collection_prefix=prefix)
    stores = Stores(
        CountingAdapter(registry, port="RunnerRegistry", counts=counts),
        FirestoreWorkItemStore(counted, collection_prefix=prefix),
        FirestoreStore(counted, collection_prefix=prefix),
    )
    waker = DispatchWaker()
    feed = FirestoreDispatchFeed(
        firestore_client, on_change=waker.notify, collection_prefix=prefix, check_seconds=0.1
    )
    records = HeardRecords(firestore_client, collection_prefix=prefix, waker=waker)
    if feed_started:
        feed.start()
        wait_until(lambda: feed.open_dispatches() is not None, what="the first push")
    if records_started:
        records.start()
        wait_until(records.listening, what="the runner changes feed's first push")
    config = RunnersConfig(poll_wait_seconds=55)
    elsewhere = Stores(
        FirestoreRunnerRegistry(firestore_client, collection_prefix=prefix),
        FirestoreWorkItemStore(firestore_client, collection_prefix=prefix),
        FirestoreStore(firestore_client, collection_prefix=prefix),
    )
    served = serve_desk(stores, fake_github, waker=waker, feed=feed, config=config, records=records)
    try:
        for desk in served:
            yield Cloud(desk, feed, records, counts, elsewhere)
    finally:
        feed.close()
        records.close()
        counted.close()


@pytest.fixture
def cloud(firestore_client: firestore.Client, fake_github: FakeGitHub) -> Iterator[Cloud]:
    yield from _cloud(firestore_client, fake_github)


@pytest.fixture
def feed_down(firestore_client: firestore.Client, fake_github: FakeGitHub) -> Iterator[Cloud]:
    """The same, but the feed never got a listener open (as while Firestore refuses it)."""
    yield from _cloud(firestore_client, fake_github, feed_started=False)


@pytest.fixture
def records_down(firestore_client: firestore.Client, fake_github: FakeGitHub) -> Iterator[Cloud]:
    """The same, but the runner changes feed never got a listener open."""
    yield from _cloud(firestore_client, fake_github, records_started=False)
