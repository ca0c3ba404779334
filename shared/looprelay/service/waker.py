"""The in-process signal a waiting long poll sleeps on: rung when a dispatch may have become
leasable, it wakes only the polls that might take what opened (``service.lease_desk`` judges).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from looprelay.core.model import DispatchRecord

RECENT_RINGS = 256
"""Rings the waker remembers, so a poll that looked before some of them can tell whether they
concern it; one that looked before more of them looks again."""


@dataclass(frozen=True)
class Opened:
    """What one ring of the waker says may have become leasable."""

    dispatches: tuple[DispatchRecord, ...] | None
    """The open dispatches that may be leasable now; None: anything may have changed (the
    dispatch feed pushed, or it is not known what opened), so every waiting poll looks."""
    runners: frozenset[str] = frozenset()
    """Runners whose polls look whatever ``dispatches`` are (a session slot was freed)."""


EVERY = 1 << 30
"""The share of a ring for polls that should all look: anything may have changed, or a
session slot was freed on their runner."""

Wants = Callable[[Opened], int]
"""A waiting poll's in-memory check: how many polls of its runner what opened is worth a look
for (0: none; ``EVERY``: all of them). The polls sharing one check (one runner's) share that
number, so a comment for a session wakes one poll of its runner, not all of them."""


def _share(wants: Wants | None, opened: Opened) -> int:
    return EVERY if opened.dispatches is None or wants is None else wants(opened)


class DispatchWaker:
    """Wakes long polls when a dispatch may have become available (in-process only).

    Scenario: 1,000 polls of runners that hold no session wait on one ``looprelay up``; a
    comment is routed to the session on runner A. The ring carries that dispatch, each poll's
    ``wants`` check (:meth:`LeaseDesk.wants`) says that only A's poll may take it (A is live:
    in memory, or one read of A's liveness for all of them), and only that one looks at the
    store: the other 999 keep waiting.

    A runner's polls share its check, and a ring wakes as many of them as it opened
    dispatches that runner might take: one comment wakes one of an agent's four waiting
    polls, not four that race for one lease. A woken poll that leases something else instead
    (a lease that had lapsed) passes its wake on (:meth:`pass_on`).

    Each :meth:`notify` counts a generation and is remembered (``RECENT_RINGS``), so a ring
    between a poll's look and its wait (read :meth:`generation` before looking, pass it to a
    wait) is not lost: the wait returns at once if one concerns it. A poll waits on a thread
    (:meth:`wait`) or, holding none, on its event loop (:meth:`wait_async`): a notify from any
    thread reaches each loop once, through ``call_soon_threadsafe``.
    """

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._generation = 0
        self._recent: deque[Opened] = deque(maxlen=RECENT_RINGS)
        self._waiting: dict[asyncio.Future[Opened], Wants | None] = {}
        self._closed = False

    def notify(
        self, dispatches: Iterable[DispatchRecord] | None = None, *, runners: Iterable[str] = ()
    ) -> None:
        """``dispatches`` may be leasable now (None: anything may have changed), or a slot was
        freed on ``runners``: wake the waiting polls that might take one."""
        opened = Opened(
            None if dispatches is None else tuple(_slim(d) for d in dispatches),
            frozenset(runners),
        )
        self._ring(opened)

    def pass_on(self, opened: Opened, *, taken: DispatchRecord) -> None:
        """A poll woken by ``opened`` leased ``taken`` instead of what opened (it was leasable
        already: a lease that lapsed): ring ``opened`` again, so another poll looks for it."""
        if opened.dispatches and all(d.dispatch_id != taken.dispatch_id for d in opened.dispatches):
            self._ring(opened)

    def _ring(self, opened: Opened) -> None:
        with self._changed:
            self._generation += 1
            self._recent.append(opened)
            self._changed.notify_all()
            checks = set(self._waiting.values())
        # Judged outside the lock: each check is in memory, but there may be a thousand; polls
        # sharing one check (one runner's) are judged once and share the answer.
        shares = {wants: _share(wants, opened) for wants in checks}
        by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[Opened]]] = {}
        with self._changed:
            # Newest first: an agent that restarted leaves its old polls waiting for a while,
            # and its live ones are the newest. A poll that began waiting since the judging
            # checks the ring itself (``_news``).
            for future, wants in reversed(list(self._waiting.items())):
                if shares.get(wants, 0) > 0:
                    shares[wants] -= 1
                    del self._waiting[future]
                    by_loop.setdefault(future.get_loop(), []).append(future)
        for loop, futures in by_loop.items():
            # One hand-off per loop however many polls wait on it; a closed loop has no polls.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_wake_all, futures, opened)

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called: the process is stopping."""
        return self._closed

    def close(self) -> None:
        """Wake every waiting poll and let no poll wait again (the process is stopping):
        each answers "no work" at once rather than being cut off."""
        with self._changed:
            self._closed = True
            self._generation += 1
            self._changed.notify_all()
            waiting, self._waiting = list(self._waiting), {}
        by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[Opened]]] = {}
        for future in waiting:
            by_loop.setdefault(future.get_loop(), []).append(future)
        for loop, futures in by_loop.items():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_wake_all, futures, Opened(None, frozenset()))

    def waiting(self) -> int:
        """How many polls wait on an event loop now (an approximate read for tests)."""
        with self._changed:
            return len(self._waiting)

    def generation(self) -> int:
        """How many times :meth:`notify` has been called so far."""
        with self._changed:
            return self._generation

    def wait(self, seconds: float, *, since: int | None = None, wants: Wants | None = None) -> None:
        """Wait up to ``seconds`` for a :meth:`notify` after generation ``since`` (default:
        after this call starts) that ``wants`` (default: any); returns at once if one already
        came."""
        with self._changed:
            seen = self._generation if since is None else since
            self._changed.wait_for(lambda: self._news(seen, wants), seconds)

    async def wait_async(
        self, seconds: float, *, since: int, wants: Wants | None = None
    ) -> Opened | None:
        """:meth:`wait` without a thread: return after a :meth:`notify` past generation
        ``since`` that ``wants``, or after ``seconds``; at once if one already came. Returns
        the ring that woke this wait (None: the wait ran out, or the ring came before it
        began). Must run on an event loop; cancelling it leaves nothing behind."""
        woken: asyncio.Future[Opened] = asyncio.get_running_loop().create_future()
        with self._changed:
            if self._news(since, wants):
                return None
            self._waiting[woken] = wants
        try:
            return await asyncio.wait_for(woken, seconds)
        except TimeoutError:
            return None
        finally:
            with self._changed:
                self._waiting.pop(woken, None)

    def _news(self, since: int, wants: Wants | None) -> bool:
        """Whether a ring after generation ``since`` concerns ``wants``; true when more rings
        came than are remembered, or once closed. Expects the lock held."""
        if self._closed:
            return True
        missed = self._generation - since
        if missed <= 0:
            return False
        if missed > len(self._recent):
            return True
        return any(_share(wants, self._recent[-back]) for back in range(1, missed + 1))


def _slim(dispatch: DispatchRecord) -> DispatchRecord:
    # The waker keeps what scheduling needs of its recent rings, not their prompts (up to
    # 60,000 characters each).
    return dispatch.model_copy(update={"prompt": "", "result": "", "detail": ""})


def _wake_all(waiters: list[asyncio.Future[Opened]], opened: Opened) -> None:
    for woken in waiters:
        if not woken.done():
            woken.set_result(opened)
