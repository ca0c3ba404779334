"""Which open dispatches have waited too long for a runner that serves their repository.

Scenario: a repository's runners are retired while dispatches for it wait. No live runner will
ever take them, and dispatches never expire by themselves, so they would pile up for good. Once
one has waited ``after`` with no live runner serving its repository (a checkout of it, or a
workspace), it is settled ``failed`` with result ``expired``: an operator sees it in
``looprelay dispatches --all`` and can replay it once a runner serves the repository again.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from looprelay.core.model import DispatchRecord, RunnerRecord
from looprelay.core.scheduling import runs_harness


def serves(runner: RunnerRecord, repository: str) -> bool:
    """Whether ``runner`` can take work in ``repository`` (names compare in any case)."""
    wanted = repository.lower()
    return runner.workspace or any(r.lower() == wanted for r in runner.repositories)


def unserved(
    pending: Iterable[DispatchRecord],
    live_runners: Sequence[RunnerRecord],
    *,
    now: datetime,
    after: timedelta,
) -> list[DispatchRecord]:
    """Return the ``pending`` dispatches created more than ``after`` before ``now`` that none
    of ``live_runners`` can take (their repository, with their harness), oldest first."""
    old = (d for d in pending if d.status == "pending" and now - d.created_at > after)
    found = [
        d
        for d in old
        if not any(serves(r, d.repository) and runs_harness(r, d) for r in live_runners)
    ]
    return sorted(found, key=lambda d: (d.created_at, d.seq, d.dispatch_id))


def expiry_detail(dispatch: DispatchRecord, *, now: datetime) -> str:
    """What the operator reads on an expired dispatch."""
    waited = int((now - dispatch.created_at).total_seconds())
    return (
        f"no live runner serves {dispatch.repository} with {dispatch.harness} after {waited} s; "
        "once one does, "
        f"`looprelay dispatches replay {dispatch.dispatch_id}`"
    )
