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


Wants = Callable[[Opened], bool]
"""A waiting poll's in-memory check: whether what opened is worth a look at the store for it."""


def _concerns(wants: Wants | None, opened: Opened) -> bool:
    return opened.dispatches is None or wants is None or wants(opened)


class DispatchWaker:
    """Wakes long polls when a dispatch may have become available (in-process only).

    Scenario: 1,000 polls of runners that hold no session wait on one ``looprelay up``; a
    comment is routed to the session on runner A. The ring carries that dispatch, each poll's
    ``wants`` check (:meth:`LeaseDesk.wants`) says in memory that only A's poll may take it,
    and only that one looks at the store: the other 999 keep waiting, at no cost.

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
        self._waiting: dict[asyncio.Future[None], Wants | None] = {}

    def notify(
        self, dispatches: Iterable[DispatchRecord] | None = None, *, runners: Iterable[str] = ()
    ) -> None:
        """``dispatches`` may be leasable now (None: anything may have changed), or a slot was
        freed on ``runners``: wake the waiting polls that might take one."""
        opened = Opened(
            None if dispatches is None else tuple(_slim(d) for d in dispatches),
            frozenset(runners),
        )
        with self._changed:
            self._generation += 1
            self._recent.append(opened)
            self._changed.notify_all()
            waiting = list(self._waiting.items())
        # Judged outside the lock: each check is in memory, but there may be a thousand; polls
        # sharing one check (one runner's) are judged once.
        judged: dict[Wants | None, bool] = {}
        woken = []
        for future, wants in waiting:
            if wants not in judged:
                judged[wants] = _concerns(wants, opened)
            if judged[wants]:
                woken.append(future)
        by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[None]]] = {}
        with self._changed:
            for future in woken:
                if future in self._waiting:  # else its wait ended meanwhile
                    del self._waiting[future]
                    by_loop.setdefault(future.get_loop(), []).append(future)
        for loop, futures in by_loop.items():
            # One hand-off per loop however many polls wait on it; a closed loop has no polls.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_wake_all, futures)

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

    async def wait_async(self, seconds: float, *, since: int, wants: Wants | None = None) -> None:
        """:meth:`wait` without a thread: return after a :meth:`notify` past generation
        ``since`` that ``wants``, or after ``seconds``; at once if one already came. Must run
        on an event loop; cancelling it leaves nothing behind."""
        woken: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        with self._changed:
            if self._news(since, wants):
                return
            self._waiting[woken] = wants
        try:
            await asyncio.wait_for(woken, seconds)
        except TimeoutError:
            pass
        finally:
            with self._changed:
                self._waiting.pop(woken, None)

    def _news(self, since: int, wants: Wants | None) -> bool:
        """Whether a ring after generation ``since`` concerns ``wants``; true when more rings
        came than are remembered. Expects the lock held."""
        missed = self._generation - since
        if missed <= 0:
            return False
        if missed > len(self._recent):
            return True
        return any(_concerns(wants, self._recent[-back]) for back in range(1, missed + 1))


def _slim(dispatch: DispatchRecord) -> DispatchRecord:
    # The waker keeps what scheduling needs of its recent rings, not their prompts (up to
    # 60,000 characters each).
    return dispatch.model_copy(update={"prompt": "", "result": "", "detail": ""})


def _wake_all(waiters: list[asyncio.Future[None]]) -> None:
    for woken in waiters:
        if not woken.done():
            woken.set_result(None)
