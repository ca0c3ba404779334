"""Runner work: long poll, leases and results (``/runner/v1/poll|renew|results``).

Scenario: a runner polls; the oldest dispatch it may take (``core.scheduling``) is leased to it
by compare-and-set, so of two racing runners exactly one gets it. While it applies the dispatch
it renews the lease; when it reports, only the lease holder's result counts, the session is
recorded on the work item, and the next dispatch of that work item becomes offerable. A lease
that lapses (a runner killed mid-apply) makes the dispatch offerable again; the agent's local
ledger keeps a paste from happening twice on the runner that died and comes back. A lease that
starts a harness (a spawn, a move to this runner, a headless turn) takes one of the runner's
session slots in its own write, and frees the slot the session held on the runner it left;
settling gives it back as ``core.slots`` says (a stop, a cleanup, a failed spawn, the end of
a headless turn).

The desk returns values and raises the project's errors (``NotFound``, ``Conflict``,
``Transient``); the runner API turns them into HTTP answers.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection, Iterable
from datetime import datetime, timedelta

from looprelay.config.model import RunnersConfig
from looprelay.core.feed import how_many_may_take, next_lapse, worth_a_look
from looprelay.core.model import DISPATCH_OPEN, DispatchRecord, EventRecord, RunnerRecord
from looprelay.core.scheduling import (
    choose_dispatch,
    heads_of_line,
    needs_session_pin,
    pin_to_sessions,
)
from looprelay.core.slots import frees_on_lease, frees_on_settle, takes_slot
from looprelay.errors import Conflict, NotFound, Transient, Unauthorized
from looprelay.ports import (
    Clock,
    DispatchFeed,
    RunnerRegistry,
    SessionSlot,
    Store,
    WorkItemStore,
)
from looprelay.service.expiry import DispatchExpiry
from looprelay.service.results import MAX_KEPT_DETAIL_CHARS, Progress
from looprelay.service.runner_cache import RunnerCache, RunnerRecords
from looprelay.service.waker import EVERY, DispatchWaker, Opened, Wants
from looprelay.wire.runner_api import (
    PollBody,
    RenewBody,
    ResultBody,
)

log = logging.getLogger("looprelay.service.lease_desk")

MAX_DISPATCH_ATTEMPTS = 5
"""Leases of one dispatch before a retryable failure becomes final."""
CLOUD_POLL_INTERVAL_SECONDS = 1.0
"""Without any signal (no waker, no feed), a long poll looks again this often."""
FEED_DOWN_LOOK_SECONDS = 5.0
"""While the dispatch feed is not live, a waiting poll looks at the store this often."""
LAPSE_MARGIN_SECONDS = 0.05
"""A poll waiting for a lease to lapse wakes this long after it did (lapsed means earlier
than now)."""
LEASE_PASSED_ON = "this runner no longer holds that lease"
"""Why a renew or a result is refused (``Conflict``, 409) after the lease moved on."""


def leasable_heads(
    items: WorkItemStore, *, now: datetime, repositories: Collection[str] | None = None
) -> list[DispatchRecord]:
    """Each session's next dispatch that may be leased now, pinned to its session's runner;
    with ``repositories``, only theirs."""
    open_heads = items.list_dispatch_heads(statuses=DISPATCH_OPEN, repositories=repositories)
    return _pinned(items, heads_of_line(open_heads, now=now))


def _pinned(items: WorkItemStore, heads: list[DispatchRecord]) -> list[DispatchRecord]:
    refs = {d.work_item for d in heads if needs_session_pin(d)}
    return pin_to_sessions(heads, items.get_work_items(refs) if refs else {})


def _pinned_elsewhere(dispatches: Iterable[DispatchRecord], runner: RunnerRecord) -> set[str]:
    """The runners other than ``runner`` that ``dispatches`` follow their sessions to: whether
    ``runner`` may take them depends on whether those are live (``core.scheduling.why_not``)."""
    ids = {d.runner_id for d in dispatches if d.runner_id is not None}
    return ids - {runner.runner_id}


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
        feed: DispatchFeed | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        expire_unserved: bool = True,
        records: RunnerRecords | None = None,
    ) -> None:
        """``waker`` wakes waiting polls (the router rings it in ``looprelay up``; in the
        cloud ``feed`` rings it); ``records`` holds runners read lately, whose liveness a
        choice then reads alone (``RunnerCache``); with ``feed`` a look checks the open
        dispatches it pushed and reads the store only for one this runner may take."""
        self._registry = registry
        self._items = work_items
        self._store = store
        self._clock = clock
        self._config = config
        self._progress = progress
        self._waker = waker
        self._feed = feed
        self._monotonic = monotonic
        self._records = records
        self._runners = RunnerCache(
            registry,
            max_age_seconds=config.runner_list_max_age_seconds,
            monotonic=monotonic,
            records=records,
        )
        self._wants: dict[str, Wants] = {}
        self._latest: dict[str, RunnerRecord] = {}
        # Expiring unserved work reads the runner list and the pending dispatches: with a feed
        # (the cloud) polls must cost no reads, so the scheduled sweeper runs it instead.
        self._expiry = (
            DispatchExpiry(
                work_items=work_items, registry=registry, store=store, clock=clock, config=config
            )
            if expire_unserved
            else None
        )

    @property
    def work_items(self) -> WorkItemStore:
        """The store of work items and dispatches the desk leases from."""
        return self._items

    @property
    def waker(self) -> DispatchWaker | None:
        """The in-process signal a poll waits on, or None (look every
        ``CLOUD_POLL_INTERVAL_SECONDS``)."""
        return self._waker

    def wants(self, runner: RunnerRecord) -> Wants:
        """The check a waiting poll of ``runner`` makes when the waker rings: how many of
        the dispatches that opened it might take (``core.feed.how_many_may_take``), so as
        many of its polls look; all of them when a slot was freed on it. It runs in memory
        but for the liveness of a runner a dispatch follows its session to, read when not
        read within ``runners.runnerListMaxAgeSeconds`` (``RunnerCache``): once for every
        waiting poll, not once by each. One check per runner, judged against its latest
        record: the waker judges it once for all of the runner's polls, which share the
        answer."""
        runner_id = runner.runner_id
        self._latest[runner_id] = runner
        known = self._wants.get(runner_id)
        if known is not None:
            return known
        lost_after = timedelta(seconds=self._config.lost_after_seconds)

        def share(opened: Opened) -> int:
            if opened.dispatches is None or runner_id in opened.runners:
                return EVERY
            latest = self._latest[runner_id]
            others = _pinned_elsewhere(opened.dispatches, latest)
            try:
                live = self._runners.live_among(
                    others, now=self._clock.now(), lost_after=lost_after
                )
            except Transient:
                return EVERY  # not knowing who is live, look: the look says what failed
            return how_many_may_take(opened.dispatches, latest, live=live)

        self._wants[runner_id] = share
        return share

    def pause_seconds(self, remaining: float) -> float:
        """How long a poll that found nothing, with ``remaining`` seconds left, waits before
        it looks again (on the waker, which may cut it short).

        With a live feed: until a change is pushed, or the earliest lease lapses (nothing
        is pushed then). With the feed down: ``FEED_DOWN_LOOK_SECONDS`` at most, so work is
        still found. Without any signal: ``CLOUD_POLL_INTERVAL_SECONDS``.
        """
        if self._waker is None:
            return min(remaining, CLOUD_POLL_INTERVAL_SECONDS)
        if self._feed is None:
            return remaining
        open_now = self._feed.open_dispatches()
        if open_now is None:
            return min(remaining, FEED_DOWN_LOOK_SECONDS)
        now = self._clock.now()
        lapse = next_lapse(open_now, now=now)
        if lapse is None:
            return remaining
        return min(remaining, (lapse - now).total_seconds() + LAPSE_MARGIN_SECONDS)

    def monotonic(self) -> float:
        """The desk's monotonic clock, which poll deadlines are measured on (tests move it)."""
        return self._monotonic()

    def poll_seconds(self, body: PollBody) -> float:
        """How long a poll with ``body`` may wait: its ``wait_seconds``, capped by
        ``runners.pollWaitSeconds``."""
        return min(body.wait_seconds, float(self._config.poll_wait_seconds))

    def try_lease(self, runner: RunnerRecord) -> DispatchRecord | None:
        """One look: lease the next dispatch ``runner`` may take and return it as leased, or
        None when there is none now. Raises ``Transient`` when the store fails, and
        ``Unauthorized`` when the runner was revoked or its secret rotated since the poll
        was authenticated (a poll is held for minutes)."""
        return self._lease_next(self._current(runner))

    def _current(self, runner: RunnerRecord) -> RunnerRecord:
        """``runner`` as the store holds it now, when a change to it was told since it was
        read (the cache dropped it): read again, so a waiting poll of a runner revoked or
        rotated meanwhile leases nothing, and one whose status changed is judged on it.
        Without a live cache, ``_confirmed`` reads it before a lease instead."""
        records = self._records
        if records is None or not records.live() or records.find(runner.runner_id):
            return runner
        mark = records.mark()
        fresh = _still_admitted(self._registry.get_runner(runner.runner_id), runner)
        records.keep(fresh, mark)
        return fresh

    def _confirmed(self, runner: RunnerRecord) -> RunnerRecord:
        """``runner`` read again before it leases, unless a live runner cache vouches for it
        (``_current``): in ``up`` a poll let in before a revocation leases nothing, for one
        read when there is something to lease, none while it waits."""
        if self._records is not None and self._records.live():
            return runner
        return _still_admitted(self._registry.get_runner(runner.runner_id), runner)

    def _candidates(self, runner: RunnerRecord, now: datetime) -> list[DispatchRecord]:
        # With a live feed, the open dispatches it pushed say in memory which heads this
        # runner may take (repositories, labels, capacity): no read unless there is one.
        # Filtering here rather than by a repository query keeps head-of-line exact, as one
        # work item's dispatches may name different repositories (a fork's pull request).
        open_now = self._feed.open_dispatches() if self._feed is not None else None
        if open_now is None:
            # Only what the runner serves: a backlog it cannot take never hides what it can.
            served = None if runner.workspace else runner.repositories
            return leasable_heads(self._items, now=now, repositories=served)
        return _pinned(self._items, worth_a_look(open_now, runner, now=now))

    def _lease_next(self, runner: RunnerRecord) -> DispatchRecord | None:
        now = self._clock.now()
        if self._expiry is not None:
            self._expiry.maybe_run()
        candidates = self._candidates(runner, now)
        if not candidates:
            return None
        lost_after = timedelta(seconds=self._config.lost_after_seconds)
        live = self._runners.live_among(
            _pinned_elsewhere(candidates, runner), now=now, lost_after=lost_after
        )
        if not how_many_may_take(candidates, runner, live=live):
            return None  # each follows its session to another live runner: no slots to read
        runner = self._confirmed(runner)
        holding = self._items.held_sessions(runner.runner_id)
        for _ in range(len(candidates)):
            pick = choose_dispatch(candidates, runner, live=live, holding=holding)
            if pick is None:
                return None
            until = now + timedelta(seconds=self._config.lease_seconds)
            leased = self._items.lease_dispatch(
                pick.dispatch_id,
                runner_id=runner.runner_id,
                now=now,
                until=until,
                slot=self._slot(pick, runner),
            )
            if leased is not None:
                self._note_lease(pick, leased, runner, now)
                return leased
            candidates = [d for d in candidates if d.dispatch_id != pick.dispatch_id]
        return None

    def _slot(self, pick: DispatchRecord, runner: RunnerRecord) -> SessionSlot | None:
        """The slot leasing ``pick`` to ``runner`` takes, in the lease's own write (racing
        polls never give a runner more harnesses than its capacity), with the slots of the
        endpoint it frees on the runners the session leaves."""
        if not takes_slot(pick, runner.runner_id):
            return None
        item = self._items.get_work_item(pick.work_item)
        session = item.sessions.get(pick.endpoint) if item else None
        frees = frees_on_lease(
            pick, runner.runner_id, session_runner=session.runner_id if session else None
        )
        return SessionSlot(pick.endpoint, pick.work_item, runner.capacity, frees)

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

    def renew(self, runner: RunnerRecord, body: RenewBody) -> datetime:
        """Extend a lease the runner still holds; return its new expiry. Raises ``Conflict``
        when the lease passed to another runner, ``Transient`` when the store fails."""
        now = self._clock.now()
        until = now + timedelta(seconds=self._config.lease_seconds)
        if not self._items.renew_lease(
            body.dispatch_id, runner_id=runner.runner_id, now=now, until=until
        ):
            raise Conflict(LEASE_PASSED_ON)
        return until

    def report(self, runner: RunnerRecord, body: ResultBody) -> str:
        """Record the lease holder's result; return the dispatch's status after it
        (``succeeded``, ``failed``, or ``pending`` to be tried again). Raises ``NotFound``
        for an unknown dispatch, ``Conflict`` when the lease passed to another runner,
        ``Transient`` when the store fails."""
        now = self._clock.now()
        dispatch = self._items.get_dispatch(body.dispatch_id)
        if dispatch is None:
            raise NotFound("no such dispatch")
        if (dispatch.status, dispatch.lease_holder) != ("leased", runner.runner_id):
            raise Conflict(LEASE_PASSED_ON)
        status = self._final_status(dispatch, body)
        # Where the session lives is written before the dispatch settles: settling opens the
        # session's next dispatch, which, routed while the spawn was pending, names no runner
        # and follows the session's record. Written after, a poll in between could give it to
        # any runner, and that one would start a second harness of the session.
        announce = self._progress.place_session(dispatch, runner, body, status)
        if not self._items.finish_dispatch(
            body.dispatch_id,
            runner_id=runner.runner_id,
            status=status,
            result=body.reason or body.status,
            now=now,
            detail=body.detail[:MAX_KEPT_DETAIL_CHARS],
        ):
            raise Conflict(LEASE_PASSED_ON)
        # The slot is freed before the GitHub notices go out: those may take seconds, and the
        # runner's capacity should not wait on them.
        freed = frees_on_settle(dispatch, status)
        if freed:
            self._items.release_session(runner.runner_id, endpoint=dispatch.endpoint)
        self._progress.record(dispatch, runner, body, final_status=status, announce=announce)
        self._ring_after_result(dispatch, runner, freed_slot=freed)
        return status

    def _ring_after_result(
        self, dispatch: DispatchRecord, runner: RunnerRecord, *, freed_slot: bool
    ) -> None:
        """Wake the polls a settled ``dispatch`` may have opened work for: those that might
        take its work item's next dispatches (one read, instead of one per waiting poll), and
        ``runner``'s when its session slot was freed. With a feed, the feed rings the polls
        its push of the change concerns; ``runner``'s look at once when a slot was freed."""
        if self._waker is None:
            return
        if self._feed is not None:
            if self._feed.open_dispatches() is None:
                self._waker.notify()  # the feed is down: no push will say what opened
            elif freed_slot:
                self._waker.notify((), runners=(runner.runner_id,))
            return
        try:
            line = self._items.list_dispatches(statuses=DISPATCH_OPEN, work_item=dispatch.work_item)
            heads = _pinned(self._items, heads_of_line(line, now=self._clock.now()))
        except Transient as exc:
            # The result is recorded; not knowing what it opened, let every poll look.
            log.warning("could not read what a result opened, waking every poll: %s", exc)
            self._waker.notify()
            return
        self._waker.notify(heads, runners=(runner.runner_id,) if freed_slot else ())

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


def _still_admitted(fresh: RunnerRecord | None, polled: RunnerRecord) -> RunnerRecord:
    """``fresh``, the registry's record of the runner whose poll let ``polled`` in;
    ``Unauthorized`` when it has been revoked or its secret rotated since."""
    if fresh is None or fresh.revoked or fresh.secret_hash != polled.secret_hash:
        raise Unauthorized(
            f"runner {polled.name} was revoked or its secret rotated while it polled"
        )
    return fresh
