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

With a ``RunnerDirectory`` (the cloud: a listener holds the runners not revoked), only when
each runner it holds was last heard from is read (``RunnerRegistry.list_last_seen``: one
liveness document each); a runner it does not hold (not listening yet, revoked, unknown,
registered a moment ago) is read whole (``RunnerRegistry.get_runners``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection
from datetime import datetime, timedelta

from looprelay.core.model import RunnerRecord
from looprelay.core.scheduling import is_live, with_last_seen
from looprelay.ports import RunnerDirectory, RunnerRegistry


class RunnerCache:
    """Each runner asked about, as read at most ``max_age_seconds`` ago (or unknown)."""

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
        if self._directory is not None:
            held = {r: found for r in runner_ids if (found := self._directory.find(r)) is not None}
        seen = self._registry.list_last_seen(held) if held else {}
        runners = {r: with_last_seen(runner, seen.get(r)) for r, runner in held.items()}
        rest = [r for r in runner_ids if r not in held]
        return runners | (self._registry.get_runners(rest) if rest else {})
