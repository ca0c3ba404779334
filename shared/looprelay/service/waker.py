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

from looprelay.core.model import DispatchRecord, RunnerRecord

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


ANYONE = ""
"""The index key of polls that name no runner: every ring judges them."""


@dataclass
class _Runner:
    """One runner's waiting polls (oldest first) and what it serves, as its latest poll said."""

    polls: dict[asyncio.Future[Opened], Wants | None]
    repositories: frozenset[str]
    workspace: bool


class _Index:
    """The waiting polls by runner, and the runners by repository served: a ring judges the
    polls of the runners its dispatches are addressed to, not every waiting poll. Expects
    the waker's lock held."""

    def __init__(self) -> None:
        self.runners: dict[str, _Runner] = {}
        self._by_repository: dict[str, set[str]] = {}
        self._any_repository: set[str] = set()
        """Runners with a workspace: they may take any repository's spawn."""

    def __len__(self) -> int:
        return sum(len(r.polls) for r in self.runners.values())

    def add(
        self,
        future: asyncio.Future[Opened],
        wants: Wants | None,
        runner: RunnerRecord | None,
    ) -> str:
        """Index ``future`` under ``runner`` (None: ``ANYONE``); return the key it went under."""
        runner_id = ANYONE if runner is None else runner.runner_id
        repositories = frozenset(() if runner is None else (r.lower() for r in runner.repositories))
        workspace = runner is not None and runner.workspace
        held = self.runners.get(runner_id)
        if held is not None and (held.repositories, held.workspace) != (repositories, workspace):
            self._unserve(runner_id, held)
            held.repositories, held.workspace = repositories, workspace
            self._serve(runner_id, held)
        if held is None:
            held = self.runners[runner_id] = _Runner({}, repositories, workspace)
            self._serve(runner_id, held)
        held.polls[future] = wants
        return runner_id

    def remove(self, future: asyncio.Future[Opened], runner_id: str) -> None:
        held = self.runners.get(runner_id)
        if held is None:
            return
        held.polls.pop(future, None)
        if not held.polls:
            self._unserve(runner_id, held)
            del self.runners[runner_id]

    def addressed(self, opened: Opened) -> set[str]:
        """The runners whose polls ``opened`` may concern: for each dispatch, the runner it
        follows its session to if that one waits here (it is live then), else every runner
        serving its repository; the runners a slot was freed on; those naming none."""
        if opened.dispatches is None:
            return set(self.runners)
        found = {r for r in opened.runners if r in self.runners}
        if ANYONE in self.runners:
            found.add(ANYONE)
        for dispatch in opened.dispatches:
            if dispatch.runner_id is not None and dispatch.runner_id in self.runners:
                found.add(dispatch.runner_id)
                continue
            found |= self._by_repository.get(dispatch.repository.lower(), set())
            found |= self._any_repository
        return found

    def _serve(self, runner_id: str, held: _Runner) -> None:
        if held.workspace:
            self._any_repository.add(runner_id)
        for repository in held.repositories:
            self._by_repository.setdefault(repository, set()).add(runner_id)

    def _unserve(self, runner_id: str, held: _Runner) -> None:
        self._any_repository.discard(runner_id)
        for repository in held.repositories:
            serving = self._by_repository.get(repository)
            if serving is not None:
                serving.discard(runner_id)
                if not serving:
                    del self._by_repository[repository]


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
    wait) is not lost: the wait returns at once if one concerns it. A poll waits on its event
    loop, holding no thread (:meth:`wait_async`): a notify from any thread reaches each loop
    once, through ``call_soon_threadsafe``.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._generation = 0
        self._recent: deque[Opened] = deque(maxlen=RECENT_RINGS)
        self._index = _Index()
        self._waiting: dict[asyncio.Future[Opened], str] = {}
        """Each waiting poll's key in ``_index``."""
        self._closed = False

    def notify(
        self, dispatches: Iterable[DispatchRecord] | None = None, runners: Iterable[str] = ()
    ) -> None:
        """``dispatches`` may be leasable now (None: anything may have changed), or a slot was
        freed on ``runners``: wake the waiting polls that might take one."""
        opened = Opened(
            None if dispatches is None else tuple(d.slim() for d in dispatches),
            frozenset(runners),
        )
        self._ring(opened)

    def pass_on(self, opened: Opened, *, taken: DispatchRecord) -> None:
        """A poll woken by ``opened`` leased ``taken`` instead of what opened (it was leasable
        already: a lease that lapsed): ring ``opened`` again, so another poll looks for it."""
        if opened.dispatches and all(d.dispatch_id != taken.dispatch_id for d in opened.dispatches):
            self._ring(opened)

    def _ring(self, opened: Opened) -> None:
        with self._lock:
            self._generation += 1
            self._recent.append(opened)
            # Only the runners the ring is addressed to: a comment for a session on runner A
            # judges A's polls, not the thousand other runners' waiting here.
            addressed = {
                r: list(self._index.runners[r].polls.items()) for r in self._index.addressed(opened)
            }
        # Judged outside the lock: each check is in memory; polls sharing one check (one
        # runner's) are judged once and share the answer.
        checks = {wants for polls in addressed.values() for _, wants in polls}
        shares = {wants: _share(wants, opened) for wants in checks}
        by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[Opened]]] = {}
        with self._lock:
            # Newest first: an agent that restarted leaves its old polls waiting for a while,
            # and its live ones are the newest. A poll that began waiting since the judging
            # checks the ring itself (``_news``).
            for runner_id, polls in addressed.items():
                for future, wants in reversed(polls):
                    if future in self._waiting and shares.get(wants, 0) > 0:
                        shares[wants] -= 1
                        del self._waiting[future]
                        self._index.remove(future, runner_id)
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
        with self._lock:
            self._closed = True
            self._generation += 1
            waiting, self._waiting, self._index = list(self._waiting), {}, _Index()
        by_loop: dict[asyncio.AbstractEventLoop, list[asyncio.Future[Opened]]] = {}
        for future in waiting:
            by_loop.setdefault(future.get_loop(), []).append(future)
        for loop, futures in by_loop.items():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_wake_all, futures, Opened(None, frozenset()))

    def waiting(self) -> int:
        """How many polls wait on an event loop now (an approximate read for tests)."""
        with self._lock:
            return len(self._waiting)

    def generation(self) -> int:
        """How many times :meth:`notify` has been called so far."""
        with self._lock:
            return self._generation

    async def wait_async(
        self,
        seconds: float,
        *,
        since: int,
        wants: Wants | None = None,
        runner: RunnerRecord | None = None,
    ) -> Opened | None:
        """Wait without a thread: return after a :meth:`notify` past generation ``since``
        that ``wants`` (default: any), or after ``seconds``; at once if one already came. Returns
        the ring that woke this wait (None: the wait ran out, or the ring came before it
        began). A wait for ``runner`` is judged only by rings addressed to it (its sessions,
        its repositories, a slot freed on it); one naming no runner by every ring. Must run
        on an event loop; cancelling it leaves nothing behind."""
        woken: asyncio.Future[Opened] = asyncio.get_running_loop().create_future()
        with self._lock:
            if self._news(since, wants):
                return None
            self._waiting[woken] = self._index.add(woken, wants, runner)
        try:
            return await asyncio.wait_for(woken, seconds)
        except TimeoutError:
            return None
        finally:
            with self._lock:
                key = self._waiting.pop(woken, None)
                if key is not None:
                    self._index.remove(woken, key)

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


def _wake_all(waiters: list[asyncio.Future[Opened]], opened: Opened) -> None:
    for woken in waiters:
        if not woken.done():
            woken.set_result(opened)
