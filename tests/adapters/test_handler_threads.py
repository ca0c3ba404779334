"""Handler threads: as many as the blocking jobs need at once, reused while idle, gone after."""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable

import pytest

from looprelay.adapters.handler_threads import HandlerThreads

WAIT_SECONDS = 5.0
"""Longest wait for something that happens in milliseconds; reaching it fails the test."""


@pytest.fixture
def name() -> str:
    """A thread-name prefix no other pool in the process uses."""
    return f"test-pool-{uuid.uuid4().hex[:8]}"


def _threads_named(name: str) -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(f"{name}-")]


def _wait_until(condition: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + WAIT_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_jobs_beyond_the_idle_threads_each_get_a_thread_and_run_at_once(name: str) -> None:
    pool = HandlerThreads(name=name)
    release = threading.Event()
    started = [threading.Event() for _ in range(5)]
    ran_on: list[str] = []

    def job(number: int) -> None:
        ran_on.append(threading.current_thread().name)
        started[number].set()
        release.wait(WAIT_SECONDS)

    # A thread that has served a job first: the five reuse it (once idle) and start the rest.
    first = threading.Event()
    pool.run(first.set)
    assert first.wait(WAIT_SECONDS)
    try:
        for number in range(5):
            pool.run(functools.partial(job, number))
        # Every job is running while none has been let go: none waits for another.
        assert all(event.wait(WAIT_SECONDS) for event in started)
        assert len(set(ran_on)) == 5
    finally:
        release.set()


def test_sequential_jobs_reuse_an_idle_thread(name: str) -> None:
    pool = HandlerThreads(name=name)
    ran_on: set[str] = set()
    for _ in range(20):
        done = threading.Event()

        def job(done: threading.Event = done) -> None:
            ran_on.add(threading.current_thread().name)
            done.set()

        pool.run(job)
        assert done.wait(WAIT_SECONDS)
    # A thread counts itself idle just after its job returns, so a job run in that moment
    # starts a second thread; never more, as the other one is idle by then.
    assert len(ran_on) <= 2
    assert len(_threads_named(name)) <= 2


def test_a_thread_idle_longer_than_idle_seconds_exits_and_the_pool_starts_another(
    name: str,
) -> None:
    pool = HandlerThreads(name=name, idle_seconds=0.1)
    release = threading.Event()
    started = [threading.Event() for _ in range(3)]

    def job(number: int) -> None:
        started[number].set()
        release.wait(WAIT_SECONDS)

    for number in range(3):
        pool.run(functools.partial(job, number))
    assert all(event.wait(WAIT_SECONDS) for event in started)
    assert len(_threads_named(name)) == 3
    release.set()

    assert _wait_until(lambda: not _threads_named(name))
    again = threading.Event()
    pool.run(again.set)
    assert again.wait(WAIT_SECONDS)


def test_a_job_that_raises_is_logged_and_the_pool_keeps_working(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="looprelay.server")
    pool = HandlerThreads(name=name)

    def explode() -> None:
        raise RuntimeError("job bug")

    pool.run(explode)
    assert _wait_until(lambda: any(r.exc_info for r in caplog.records))
    [record] = caplog.records
    assert record.exc_info is not None
    assert (record.levelno, str(record.exc_info[1])) == (logging.ERROR, "job bug")
    assert name in record.getMessage()

    # Three jobs that each wait for the other two: the pool still runs them at once.
    together = threading.Barrier(3, timeout=WAIT_SECONDS)
    met = [threading.Event() for _ in range(3)]

    def meet(event: threading.Event) -> None:
        together.wait()
        event.set()

    for event in met:
        pool.run(functools.partial(meet, event))
    assert all(event.wait(WAIT_SECONDS) for event in met)
