"""The runner API on an event loop: a long poll waits without a thread.

Scenario: a runner polls; its credentials and body are checked on a pool thread, and the
poll looks for a dispatch on that same thread (the store blocks). Finding none, it waits on
the loop until the ``DispatchWaker`` rings with work it might take (a dispatch was saved or a
result came back, checked in memory against the runner; in the cloud, the dispatch feed
pushed a change) or a lease lapses; then it looks again, until its wait is over (204). A
thousand waiting polls are a thousand small coroutines, not a thousand threads.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass

from looprelay.app.asgi import AsyncHandler, Blocking
from looprelay.app.messages import Request, Response, json_response
from looprelay.app.runner_http import NOTHING_TO_LEASE, RunnerHttp, lease_answer
from looprelay.core.model import DispatchRecord, RunnerRecord
from looprelay.errors import Transient, Unauthorized
from looprelay.service.lease_desk import LeaseDesk
from looprelay.service.runners import RunnerApi
from looprelay.wire.runner_api import API_PREFIX, PollBody

log = logging.getLogger("looprelay.service.runners")

POLL_PATH = API_PREFIX + "poll"


def runner_api_handler(api: RunnerApi, blocking: Blocking) -> AsyncHandler:
    """``/runner/v1/...``: the poll waits on the loop, every other call runs on the pool."""
    http = RunnerHttp(api)
    threaded = blocking(http.handle)

    async def handle(request: Request) -> Response:
        desk = api.desk
        if request.path != POLL_PATH or desk is None:
            return await threaded(request)
        # One trip to the pool for the checks and the first look: most polls that find work
        # find it there, and each trip is two thread hand-offs on a busy interpreter.
        admitted = await blocking.run(lambda: _admit_and_look(http, desk, request))
        if isinstance(admitted, Response):
            return admitted
        runner, body, first = admitted
        return await long_poll(desk, runner, body, blocking, first=first)

    return handle


@dataclass(frozen=True)
class Look:
    """One look for a dispatch: the waker's generation read before it, and what it leased."""

    seen: int
    leased: DispatchRecord | None


def look(desk: LeaseDesk, runner: RunnerRecord) -> Look:
    """Lease the next dispatch ``runner`` may take, if any, on this (a pool) thread. Raises
    ``Transient`` when the store fails."""
    # Read before looking: a dispatch saved after the look rings a later generation.
    seen = desk.waker.generation() if desk.waker is not None else 0
    return Look(seen, desk.try_lease(runner))


def _admit_and_look(
    http: RunnerHttp, desk: LeaseDesk, request: Request
) -> Response | tuple[RunnerRecord, PollBody, Look]:
    admitted = http.admit_poll(request)
    if isinstance(admitted, Response):
        return admitted
    runner, body = admitted
    try:
        return runner, body, look(desk, runner)
    except Transient as exc:
        return _store_failed(exc)
    except Unauthorized as exc:
        return _refused(exc)


def _refused(exc: Unauthorized) -> Response:
    return json_response(exc.status, {"error": str(exc)})


def _store_failed(exc: Transient) -> Response:
    log.error("runner API store failure: %s", exc)
    return json_response(503, {"error": "temporarily unavailable; retry"})


async def long_poll(
    desk: LeaseDesk,
    runner: RunnerRecord,
    body: PollBody,
    blocking: Blocking,
    *,
    first: Look | None = None,
) -> Response:
    """Lease the next dispatch ``runner`` may take, waiting up to ``desk.poll_seconds(body)``
    after ``first`` (a look already made) or a look of its own; 204 when nothing came or the
    waker closed (the process is stopping), 503 when the store failed (the runner polls
    again)."""
    deadline = desk.monotonic() + desk.poll_seconds(body)
    waker = desk.waker
    wants = desk.wants(runner)
    looked, woken_by = first, None
    while True:
        if looked is None:
            try:
                looked = await blocking.run(lambda: look(desk, runner))
            except Transient as exc:
                return _store_failed(exc)
            except Unauthorized as exc:  # revoked or rotated while it waited
                return _refused(exc)
        if looked.leased is not None:
            if waker is not None and woken_by is not None:
                waker.pass_on(woken_by, taken=looked.leased)
            return lease_answer(looked.leased)
        remaining = deadline - desk.monotonic()
        if remaining <= 0 or (waker is not None and waker.closed):
            return NOTHING_TO_LEASE  # the wait is over, or the process is stopping
        if woken_by is None and looked is first:
            log.debug("a poll of runner %s waits", runner.runner_id)  # tests wait for it
        if waker is not None:
            # Woken only by a ring this runner might act on, and only as many of its polls
            # as it opened dispatches for: the others cost it no look.
            woken_by = await waker.wait_async(
                desk.pause_seconds(remaining), since=looked.seen, wants=wants, runner=runner
            )
        else:
            await asyncio.sleep(desk.pause_seconds(remaining))
        looked = None
