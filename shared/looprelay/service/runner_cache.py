"""Which runners are live, read from the registry at most once per ``maxAge`` per process.

Scenario: 200 runners poll one instance of the runner API. Choosing a dispatch needs to know
which runners are live (a session's dispatch waits for its runner while that one is live),
but reading 200 runner documents per look would cost more than the look. The list is kept
for ``runners.runnerListMaxAgeSeconds`` and read again only when a look needs it after that;
revoked runners are not read at all. A runner that falls silent is noticed that much later.
With a ``RunnerDirectory`` (the cloud: a listener holds the runners), only when each runner
was last heard from is read (``RunnerRegistry.list_last_seen``), not the runners themselves.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

from looprelay.core.model import RunnerRecord
from looprelay.core.scheduling import is_live, with_last_seen
from looprelay.ports import RunnerDirectory, RunnerRegistry


class RunnerCache:
    """The registry's runners (revoked ones left out), at most ``max_age_seconds`` old."""

    def __init__(
        self,
        registry: RunnerRegistry,
        *,
        max_age_seconds: float,
        monotonic: Callable[[], float] = time.monotonic,
        directory: RunnerDirectory | None = None,
    ) -> None:
        self._registry = registry
        self._directory = directory
        self._max_age = max_age_seconds
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._runners: list[RunnerRecord] = []
        self._read_at: float | None = None
        self._by_id: dict[str, RunnerRecord] | None = None

    def live_ids(self, *, now: datetime, lost_after: timedelta) -> list[str]:
        """Return the ids of the runners live at ``now``. Raises ``Transient`` when the list
        must be read again and the store fails."""
        return [r.runner_id for r in self._current() if is_live(r, now=now, lost_after=lost_after)]

    def known_live(
        self, runner_ids: Iterable[str], *, now: datetime, lost_after: timedelta
    ) -> list[str] | None:
        """Return which of ``runner_ids`` were live at ``now`` as of the list last read,
        without reading it (a waiting poll's in-memory check); None when it was never read."""
        by_id = self._by_id  # replaced whole on each read: no lock needed to look at it
        if by_id is None:
            return None
        return [
            runner_id
            for runner_id in runner_ids
            if (runner := by_id.get(runner_id)) is not None
            and is_live(runner, now=now, lost_after=lost_after)
        ]

    def _current(self) -> list[RunnerRecord]:
        # One reader at a time: the polls that find the list stale together wait for one read.
        with self._lock:
            at = self._monotonic()
            if self._read_at is None or at - self._read_at >= self._max_age:
                self._runners = self._read()
                self._by_id = {r.runner_id: r for r in self._runners}
                self._read_at = at
            return self._runners

    def _read(self) -> list[RunnerRecord]:
        held = self._directory.runners() if self._directory is not None else None
        if held is None:
            return self._registry.list_runners(include_revoked=False)
        seen = self._registry.list_last_seen()
        return [with_last_seen(r, seen.get(r.runner_id)) for r in held]
