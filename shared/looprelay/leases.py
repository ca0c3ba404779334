"""Runner work: long poll, leases and results (``/runner/v1/poll|renew|results``).

Scenario: a runner polls; the oldest dispatch it may take (``core.scheduling``) is leased to it
by compare-and-set, so of two racing runners exactly one gets it. While it applies the dispatch
it renews the lease; when it reports, only the lease holder's result counts, the session is
recorded on the work item, and the next dispatch of that work item becomes offerable. A lease
that lapses (a runner killed mid-apply) makes the dispatch offerable again; the agent's local
ledger keeps a paste from happening twice on the runner that died and comes back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

from looprelay.config import RunnersConfig
from looprelay.core.scheduling import (
    choose_dispatch,
    heads_of_line,
    is_live,
    needs_session_pin,
    pin_to_sessions,
)
from looprelay.httpmsg import Response, json_response
from looprelay.ports import Clock, RunnerRegistry, Store, WorkItemStore
from looprelay.progress import MAX_KEPT_DETAIL_CHARS, Progress
from looprelay.records import DISPATCH_OPEN, DispatchRecord, EventRecord, RunnerRecord
from looprelay.runnerapi_models import (
    Leased,
    PollBody,
    RenewBody,
    Renewed,
    Reported,
    ResultBody,
)

log = logging.getLogger("looprelay.leases")

MAX_DISPATCH_ATTEMPTS = 5
"""Leases of one dispatch before a retryable failure becomes final."""
CLOUD_POLL_INTERVAL_SECONDS = 1.0
"""Without an in-process signal (separate functions), a long poll looks again this often."""
NOTHING_TO_LEASE = Response(status=204, body=b"")
"""A poll's answer when nothing came within its wait."""


class DispatchWaker:
    """Wakes long polls when a dispatch may have become available (in-process only).

    Each :meth:`notify` counts a generation, so a ring between a poll's look and its wait
    (read :meth:`generation` before looking, pass it to a wait) is not lost. A poll waits on
    a thread (:meth:`wait`) or, holding none, on its event loop (:meth:`wait_async`): a
    notify from any thread reaches each loop once, through ``call_soon_threadsafe``.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._generation = 0
        self._loops: dict[asyncio.AbstractEventLoop, set[asyncio.Future[None]]] = {}

    def notify(self) -> None:
        """Something changed: wake every waiting poll."""
        with self._changed:
            self._generation += 1
            self._changed.notify_all()
            loops, self._loops = self._loops, {}
        for loop, waiters in loops.items():
            # One hand-off per loop however many polls wait on it; a closed loop has no polls.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_wake_all, waiters)

    def generation(self) -> int:
        """How many times :meth:`notify` has been called so far."""
        with self._changed:
            return self._generation

    def wait(self, seconds: float, *, since: int | None = None) -> None:
        """Wait up to ``seconds`` for a :meth:`notify` after generation ``since`` (default:
        after this call starts); returns at once if one already came."""
        with self._changed:
            seen = self._generation if since is None else since
            self._changed.wait_for(lambda: self._generation != seen, seconds)

    async def wait_async(self, seconds: float, *, since: int) -> None:
        """:meth:`wait` without a thread: return after a :meth:`notify` past generation
        ``since``, or after ``seconds``; at once if one already came. Must run on an event
        loop; cancelling it leaves nothing behind."""
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()
        with self._changed:
            if self._generation != since:
                return
            self._loops.setdefault(loop, set()).add(woken)
        try:
            await asyncio.wait_for(woken, seconds)
        except TimeoutError:
            pass
        finally:
            with self._changed:
                self._loops.get(loop, set()).discard(woken)


def _wake_all(waiters: set[asyncio.Future[None]]) -> None:
    for woken in waiters:
        if not woken.done():
            woken.set_result(None)


def leasable_heads(items: WorkItemStore, *, now: datetime) -> list[DispatchRecord]:
    """Each work item's next dispatch that may be leased now, pinned to its session's runner."""
    heads = heads_of_line(items.list_dispatch_heads(statuses=DISPATCH_OPEN), now=now)
    refs = {d.work_item for d in heads if needs_session_pin(d)}
    return pin_to_sessions(heads, items.get_work_items(refs) if refs else {})


class LeaseDesk:
    """Hands out dispatches and takes results back."""

    def __init__(
        self,
        *,
        registry: RunnerRegistry,
        work_items: WorkItemStore,
        store: Store,
        clock: Clock,
        config: RunnersConfig,
        progress: Progress,
        waker: DispatchWaker | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._registry = registry
        self._items = work_items
        self._store = store
        self._clock = clock
        self._config = config
        self._progress = progress
        self._waker = waker
        self._monotonic = monotonic

    def poll(self, runner: RunnerRecord, body: PollBody) -> Response:
        """Lease the next dispatch ``runner`` may take, waiting up to ``body.wait_seconds``
        (capped by ``runners.pollWaitSeconds``) on this thread; 204 when nothing came.

        The ASGI application waits without a thread instead (``app.longpoll``), between
        :meth:`try_lease` calls.
        """
        deadline = self._monotonic() + self.poll_seconds(body)
        while True:
            # Read before looking: a dispatch saved after the look rings a later generation.
            seen = self._waker.generation() if self._waker is not None else 0
            leased = self.try_lease(runner)
            if leased is not None:
                return leased
            remaining = deadline - self._monotonic()
            if remaining <= 0:
                return NOTHING_TO_LEASE
            if self._waker is not None:
                self._waker.wait(remaining, since=seen)
            else:
                time.sleep(min(remaining, CLOUD_POLL_INTERVAL_SECONDS))

    @property
    def work_items(self) -> WorkItemStore:
        """The store of work items and dispatches the desk leases from."""
        return self._items

    @property
    def waker(self) -> DispatchWaker | None:
        """The in-process signal a poll waits on, or None (look every
        ``CLOUD_POLL_INTERVAL_SECONDS``)."""
        return self._waker

    def monotonic(self) -> float:
        """The desk's monotonic clock, which poll deadlines are measured on (tests move it)."""
        return self._monotonic()

    def poll_seconds(self, body: PollBody) -> float:
        """How long a poll with ``body`` may wait: its ``wait_seconds``, capped by
        ``runners.pollWaitSeconds``."""
        return min(body.wait_seconds, float(self._config.poll_wait_seconds))

    def try_lease(self, runner: RunnerRecord) -> Response | None:
        """One look: the 200 answer leasing the next dispatch ``runner`` may take, or None
        when there is none now. Raises ``Transient`` when the store fails."""
        leased = self._lease_next(runner)
        if leased is None:
            return None
        return json_response(200, Leased(dispatch=leased).model_dump(mode="json"))

    def _lease_next(self, runner: RunnerRecord) -> DispatchRecord | None:
        now = self._clock.now()
        lost_after = timedelta(seconds=self._config.lost_after_seconds)
        live = [
            r.runner_id
            for r in self._registry.list_runners()
            if is_live(r, now=now, lost_after=lost_after)
        ]
        candidates = leasable_heads(self._items, now=now)
        for _ in range(len(candidates)):
            pick = choose_dispatch(candidates, runner, live=live)
            if pick is None:
                return None
            until = now + timedelta(seconds=self._config.lease_seconds)
            leased = self._items.lease_dispatch(
                pick.dispatch_id, runner_id=runner.runner_id, now=now, until=until
            )
            if leased is not None:
                self._note_lease(pick, leased, runner, now)
                return leased
            candidates = [d for d in candidates if d.dispatch_id != pick.dispatch_id]
        return None

    def _note_lease(
        self, before: DispatchRecord, leased: DispatchRecord, runner: RunnerRecord, now: datetime
    ) -> None:
        if before.status == "leased":
            self._event(
                "lease.expired", leased, now, {"from": before.lease_holder, "to": runner.runner_id}
            )
        if before.runner_id not in (None, runner.runner_id):
            self._event(
                "runner.lost",
                leased,
                now,
                {"runner_id": before.runner_id, "taken_by": runner.runner_id},
            )

    def renew(self, runner: RunnerRecord, body: RenewBody) -> Response:
        """Extend a lease the runner still holds; 409 when it passed to another."""
        now = self._clock.now()
        until = now + timedelta(seconds=self._config.lease_seconds)
        if not self._items.renew_lease(
            body.dispatch_id, runner_id=runner.runner_id, now=now, until=until
        ):
            return json_response(409, {"error": "this runner no longer holds that lease"})
        return json_response(200, Renewed(lease_expires_at=until.isoformat()).model_dump())

    def report(self, runner: RunnerRecord, body: ResultBody) -> Response:
        """Record the lease holder's result; 409 when the lease passed to another runner."""
        now = self._clock.now()
        dispatch = self._items.get_dispatch(body.dispatch_id)
        if dispatch is None:
            return json_response(404, {"error": "no such dispatch"})
        status = self._final_status(dispatch, body)
        if not self._items.finish_dispatch(
            body.dispatch_id,
            runner_id=runner.runner_id,
            status=status,
            result=body.reason or body.status,
            now=now,
            detail=body.detail[:MAX_KEPT_DETAIL_CHARS],
        ):
            return json_response(409, {"error": "this runner no longer holds that lease"})
        self._progress.record(dispatch, runner, body, final_status=status)
        if self._waker is not None:
            self._waker.notify()
        return json_response(200, Reported(status=status).model_dump())

    @staticmethod
    def _final_status(dispatch: DispatchRecord, body: ResultBody) -> str:
        if body.status != "failed":
            return "succeeded"
        again = body.retryable and dispatch.attempts < MAX_DISPATCH_ATTEMPTS
        return "pending" if again else "failed"

    def _event(
        self, name: str, dispatch: DispatchRecord, now: datetime, data: dict[str, object]
    ) -> None:
        self._store.append_event(
            EventRecord(
                name=name,
                at=now,
                delivery_id=dispatch.delivery_id,
                work_item=dispatch.work_item,
                data={"dispatch_id": dispatch.dispatch_id, **data},
            )
        )
