"""What a waiting poll learns from the open dispatches a change feed pushed, without a read.

Scenario: 200 runners wait on one instance of the runner API. A dispatch for
``octo/app`` is saved; the feed pushes the open dispatches, and every poll checks them in
memory: the three runners serving ``octo/app`` with the labels it asks for look at the store
(the lease), the other 197 go back to waiting at no cost. A lease held by a runner that died
lapses without any change to push, so a poll also wakes when the earliest lease lapses.
In ``looprelay up`` the waker itself says what opened (a saved dispatch, the next one of a
session whose result came back), and only the polls of runners that might take it wake.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from looprelay.core.model import DispatchRecord, RunnerRecord
from looprelay.core.scheduling import heads_of_line, why_not


def worth_a_look(
    open_dispatches: Iterable[DispatchRecord], runner: RunnerRecord, *, now: datetime
) -> list[DispatchRecord]:
    """Return the heads of line leasable now that ``runner`` may take, oldest first.

    A superset of what it will get: whether a session's runner is still live is left to the
    lease desk, which needs the runner list for it.
    """
    heads = heads_of_line(open_dispatches, now=now)
    return [d for d in heads if why_not(d, runner, live=()) is None]


def how_many_may_take(
    changed: Iterable[DispatchRecord], runner: RunnerRecord, *, live: Sequence[str]
) -> int:
    """How many of ``changed`` ``runner`` might take, so as many of its waiting polls look.

    Expects ``live``, the ids of the runners known live: a dispatch that follows its session to
    another live runner is not for this one. A superset otherwise: the runner is judged as
    holding no session (the server's count of its slots is in the store, so the look decides
    capacity), and head of line is left to the look too.
    """
    return sum(why_not(d, runner, live=live, holding=()) is None for d in changed)


def next_lapse(open_dispatches: Iterable[DispatchRecord], *, now: datetime) -> datetime | None:
    """Return when the earliest lease still running after ``now`` lapses, or None."""
    ends = [
        d.lease_expires_at
        for d in open_dispatches
        if d.status == "leased" and d.lease_expires_at is not None and d.lease_expires_at >= now
    ]
    return min(ends, default=None)
