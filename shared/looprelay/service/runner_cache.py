"""Whether the runners a choice depends on are live, each read at most once per ``maxAge``.

Scenario: 10,000 runners poll 40 instances of the runner API while work flows. A dispatch
that follows its session waits for the session's runner while that one is live
(``core.scheduling.why_not``), so choosing among a poll's candidates needs the liveness of
the runners they are pinned to, and of no other: the polling runner is live (it is asking),
and a candidate pinned to no runner asks about none. Each runner's liveness is kept for
``runners.runnerListMaxAgeSeconds`` and read again only when a look needs it after that, so
a look reads at most the few runners its candidates name, never all 10,000. A waiting poll's
check of what a ring opened (``LeaseDesk.wants``) asks the same cache, so a thousand polls
share one read. A runner that falls silent is noticed that much later.

With ``RunnerRecords`` (the runners authenticated lately, kept while no change to them is
pushed), only when each runner it holds was last heard from is read
(``RunnerRegistry.list_last_seen``: one liveness document each); a runner it does not hold
is read whole (``RunnerRegistry.get_runners``).

``RunnerRecords`` is what lets an idle runner's polls read nothing without each instance
holding the fleet: a bounded cache of runner records, each read on a miss and dropped when
the store's ``RunnerChanges`` feed says it changed (revoked, rotated, a new status), or
when the feed drops (a change may have been missed). While the feed is not live it vouches
for nobody, so a revocation holds on a fresh instance, or in a process forked from one.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime, timedelta

from looprelay.core.model import RunnerRecord
from looprelay.core.scheduling import is_live, with_last_seen
from looprelay.ports import RunnerChanges, RunnerRegistry

DEFAULT_KEPT_RUNNERS = 20_000
"""Runner records one instance keeps (about 1 KiB each; ``runners.cachedRunners``)."""


@dataclass(frozen=True)
class Mark:
    """Where the feed stood when a read began: a record read then is kept only if no change
    to it, and no drop, was told since."""

    epoch: int
    told: int


class RunnerRecords:
    """Runners as last read, kept while ``changes`` is live and tells no change to them: at
    most ``size``, the least recently used dropped first. Safe across threads."""

    def __init__(
        self,
        changes: RunnerChanges,
        *,
        size: int = DEFAULT_KEPT_RUNNERS,
        told: Callable[[Collection[str]], None] = lambda _ids: None,
    ) -> None:
        """``told`` hears the ids of each change after they are dropped (the runner API
        wakes those runners' waiting polls, which then read them again)."""
        self._changes = changes
        self._size = size
        self._told_to = told
        self._lock = threading.Lock()
        self._held: OrderedDict[str, RunnerRecord] = OrderedDict()
        self._epoch = 0
        """Counts drops of the feed: nothing read before one is kept."""
        self._told = 0
        """Counts changes told; ``_last_told`` keeps when each runner's latest came."""
        self._last_told: OrderedDict[str, int] = OrderedDict()
        self._forgotten = 0
        """The latest told count dropped from ``_last_told`` (bounded like ``_held``)."""

    def start(self) -> None:
        """Start the feed in this process (the one that serves)."""
        self._changes.start(self.changed)

    def close(self) -> None:
        """Stop the feed; nothing is vouched for from then on."""
        self._changes.close()

    def changed(self, runner_ids: Collection[str] | None) -> None:
        """The feed's news: drop ``runner_ids``, or everything (None: changes were missed)."""
        with self._lock:
            if runner_ids is None:
                self._epoch += 1
                self._held.clear()
                return
            self._told += 1
            for runner_id in runner_ids:
                self._held.pop(runner_id, None)
                self._last_told[runner_id] = self._told
                self._last_told.move_to_end(runner_id)
            while len(self._last_told) > self._size:
                _, self._forgotten = self._last_told.popitem(last=False)
        self._told_to(runner_ids)

    def live(self) -> bool:
        """Whether the feed is live in this process: only then is anything vouched for."""
        return self._changes.live()

    def find(self, runner_id: str) -> RunnerRecord | None:
        """The runner as last read, or None when not held or the feed is not live here (the
        caller reads the registry, then :meth:`keep` s what it read)."""
        if not self._changes.live():
            return None
        with self._lock:
            held = self._held.get(runner_id)
            if held is not None:
                self._held.move_to_end(runner_id)
            return held

    def mark(self) -> Mark | None:
        """Where the feed stands, to take before reading a runner; None when it is not live
        (what is read then is not kept)."""
        if not self._changes.live():
            return None
        with self._lock:
            return Mark(self._epoch, self._told)

    def keep(self, runner: RunnerRecord, mark: Mark | None) -> None:
        """Hold ``runner`` as read after ``mark``, unless a change to it (or a drop) was
        told since: the read may predate that change."""
        if mark is None:
            return
        runner_id = runner.runner_id
        with self._lock:
            if mark.epoch != self._epoch or mark.told < self._forgotten:
                return
            if self._last_told.get(runner_id, -1) > mark.told:
                return
            self._held[runner_id] = runner
            self._held.move_to_end(runner_id)
            while len(self._held) > self._size:
                self._held.popitem(last=False)

    def __len__(self) -> int:
        with self._lock:
            return len(self._held)


class RunnerCache:
    """Each runner asked about, as read at most ``max_age_seconds`` ago (or unknown)."""

    def __init__(
        self,
        registry: RunnerRegistry,
        *,
        max_age_seconds: float,
        monotonic: Callable[[], float] = time.monotonic,
        records: RunnerRecords | None = None,
    ) -> None:
        self._registry = registry
        self._records = records
        self._max_age = max_age_seconds
        self._monotonic = monotonic
        self._lock = threading.Lock()
        # runner id -> (when read, on the monotonic clock; the runner, None if unknown)
        self._held: dict[str, tuple[float, RunnerRecord | None]] = {}

    def live_among(
        self, runner_ids: Collection[str], *, now: datetime, lost_after: timedelta
    ) -> list[str]:
        """Return which of ``runner_ids`` are live at ``now``, reading those not read within
        ``max_age_seconds`` (in one round trip; none when there is none). Raises
        ``Transient`` when one must be read and the store fails."""
        # One reader at a time: looks that find the same runners stale together wait for one
        # read, and then find them fresh.
        with self._lock:
            at = self._monotonic()
            stale = [
                runner_id
                for runner_id in runner_ids
                if (held := self._held.get(runner_id)) is None or at - held[0] >= self._max_age
            ]
            if stale:
                found = self._read_runners(stale)
                self._held.update((r, (at, found.get(r))) for r in stale)
            runners = [self._held[runner_id][1] for runner_id in runner_ids]
        return [
            runner.runner_id
            for runner in runners
            if runner is not None and is_live(runner, now=now, lost_after=lost_after)
        ]

    def _read_runners(self, runner_ids: list[str]) -> dict[str, RunnerRecord]:
        held: dict[str, RunnerRecord] = {}
        if self._records is not None:
            held = {r: found for r in runner_ids if (found := self._records.find(r)) is not None}
        seen = self._registry.list_last_seen(held) if held else {}
        runners = {r: with_last_seen(runner, seen.get(r)) for r, runner in held.items()}
        rest = [r for r in runner_ids if r not in held]
        return runners | (self._registry.get_runners(rest) if rest else {})
