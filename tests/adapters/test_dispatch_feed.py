"""The cloud runner API's change feed on the Firestore emulator: one listener wakes waiting
polls, an idle poll reads nothing, a dropped listener is opened again, and polls still find
work while the feed is down. Served by ``tests/cloud_rig.py``.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from bench.storecount import OpCounts
from looprelay.service.lease_desk import FEED_DOWN_LOOK_SECONDS
from tests.cloud_rig import LONG_WAIT, WOKEN_WITHIN, Cloud
from tests.dispatches import make_dispatch, save_with_own_session
from tests.fake_harness import wait_until
from tests.test_leases import HTTP_TIMEOUT, Runner

pytestmark = pytest.mark.firestore


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
    runner = cloud.runner("a")
    assert _leased_soon_after_saving(cloud, runner, 1) < WOKEN_WITHIN
    assert cloud.feed.listeners_opened == 1


def test_an_idle_poll_reads_nothing(cloud: Cloud) -> None:
    """A poll costs no read, its authentication included (the directory holds its runner):
    not when nothing changes, and not when a dispatch for another repository is saved while
    it waits (the listener pays one read for it)."""
    runner = cloud.runner("a")
    before, listened = cloud.counts.snapshot(), cloud.feed.reads
    response = cloud.desk.poll(runner, 2.0)
    assert response.status_code == 204
    assert OpCounts.minus(cloud.counts.snapshot(), before) == {}
    assert cloud.feed.reads == listened

    with ThreadPoolExecutor(1) as pool:
        before = cloud.counts.snapshot()
        answer = pool.submit(cloud.desk.poll, runner, 4.0)
        other = make_dispatch(
            repository="octo/elsewhere", number=9, created_at=cloud.desk.clock.now()
        )
        save_with_own_session(
            cloud.elsewhere.work_items,
            repository="octo/elsewhere",
            number=9,
            dispatches=[other],
            now=cloud.desk.clock.now(),
        )
        wait_until(lambda: cloud.open_count() == 1, what="the push of the other dispatch")
        assert answer.result(timeout=HTTP_TIMEOUT).status_code == 204
    assert OpCounts.minus(cloud.counts.snapshot(), before) == {}
    assert cloud.feed.reads == listened + 1


def test_a_dropped_listener_is_opened_again_and_wakes_polls(cloud: Cloud) -> None:
    runner = cloud.runner("a")
    # What the client library does when the server ends the stream with an error it does
    # not retry: the listener closes for good.
    cloud.feed._listened._watch.close()
    wait_until(
        lambda: cloud.feed.listeners_opened == 2 and cloud.feed.open_dispatches() is not None,
        what="a second listener's first push",
    )
    assert _leased_soon_after_saving(cloud, runner, 2) < WOKEN_WITHIN


def test_while_the_feed_is_down_polls_still_find_work(feed_down: Cloud) -> None:
    runner = feed_down.runner("a")
    assert feed_down.feed.open_dispatches() is None
    waited = _leased_soon_after_saving(feed_down, runner, 3)
    assert waited < FEED_DOWN_LOOK_SECONDS + WOKEN_WITHIN
