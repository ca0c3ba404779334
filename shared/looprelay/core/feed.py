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
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Opening:
    """What one push of the open dispatches opened."""

    heads: list[DispatchRecord]
    """The heads of line, leasable now, of the work items the push touched."""
    freed: frozenset[str]
    """The runners whose lease of a dispatch that left the open ones may have freed a slot."""


def opened_by(
    changed: Iterable[DispatchRecord], open_now: Iterable[DispatchRecord], *, now: datetime
) -> Opening:
    """What ``changed`` (dispatches that entered, changed in or left the open ones; those
    that left as last held) opened, given ``open_now``: the heads of line of their work items
    (a settled dispatch makes the next of its session the head), and the runners that held a
    lease on one that left. Costs the work items touched, not every open dispatch's line."""
    changed = list(changed)
    touched = {d.work_item for d in changed}
    lines = [d for d in open_now if d.work_item in touched]
    still = {d.dispatch_id for d in lines}
    freed = {d.lease_holder for d in changed if d.dispatch_id not in still and d.lease_holder}
    return Opening(heads_of_line(lines, now=now), frozenset(freed))
