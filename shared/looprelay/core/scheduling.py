"""Which dispatch a polling runner gets (SPEC §3, "Affinity and targeting").

Scenario: work item #7's session lives on runner A. Its next dispatch (seq 5) waits until seq 4
is settled, then goes to A alone while A is live; if A falls silent past ``lostAfterSeconds``,
any eligible runner may take it and respawn the session there. A spawn for a new session goes
to a live runner that serves the repository (a checkout of it, or a workspace), carries every
label the dispatch asks for, and has a free session slot. Runners never wait on each other:
a runner skips what it may not take and gets the oldest thing it may.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from looprelay.records import DISPATCH_OPEN, DispatchRecord, RunnerRecord, WorkItemRecord


@dataclass(frozen=True)
class Waiting:
    """A dispatch nobody may take right now, and why (for operators)."""

    dispatch_id: str
    reason: str


def is_live(runner: RunnerRecord, *, now: datetime, lost_after: timedelta) -> bool:
    """Whether ``runner`` has been heard from recently and is not revoked."""
    seen = runner.last_seen_at or runner.registered_at
    return not runner.revoked and now - seen <= lost_after


def heads_of_line(
    open_dispatches: Iterable[DispatchRecord], *, now: datetime
) -> list[DispatchRecord]:
    """Return, per work item, its lowest-``seq`` unsettled dispatch if it can be leased now
    (pending, or its lease lapsed), oldest first. Later ones wait their turn."""
    first: dict[str, DispatchRecord] = {}
    for dispatch in open_dispatches:
        if dispatch.status not in DISPATCH_OPEN:
            continue
        held = first.get(dispatch.work_item)
        if held is None or dispatch.seq < held.seq:
            first[dispatch.work_item] = dispatch
    ready = [d for d in first.values() if _leasable(d, now)]
    return sorted(ready, key=lambda d: (d.created_at, d.seq, d.dispatch_id))


def needs_session_pin(dispatch: DispatchRecord) -> bool:
    """Whether ``dispatch`` goes to an existing session but was routed before that session's
    runner was known (while its spawn was still pending)."""
    return dispatch.runner_id is None and dispatch.kind != "spawn"


def pin_to_sessions(
    candidates: Sequence[DispatchRecord], work_items: Mapping[str, WorkItemRecord]
) -> list[DispatchRecord]:
    """Give each candidate that :func:`needs_session_pin` the runner its endpoint's session
    now lives on, so it follows the session instead of going to whoever polls first (which
    would start a second harness for one work item)."""
    pinned = []
    for dispatch in candidates:
        item = work_items.get(dispatch.work_item)
        session = item.sessions.get(dispatch.endpoint) if item else None
        if needs_session_pin(dispatch) and session is not None and session.runner_id:
            pinned.append(dispatch.model_copy(update={"runner_id": session.runner_id}))
        else:
            pinned.append(dispatch)
    return pinned


def _leasable(dispatch: DispatchRecord, now: datetime) -> bool:
    if dispatch.status == "pending":
        return True
    return dispatch.lease_expires_at is not None and dispatch.lease_expires_at < now


def why_not(dispatch: DispatchRecord, runner: RunnerRecord, *, live: Sequence[str]) -> str | None:
    """Return why ``runner`` may not take ``dispatch`` (None: it may).

    Expects the ids of the live runners. Never raises.
    """
    if dispatch.runner_id not in (None, runner.runner_id) and dispatch.runner_id in live:
        return "session-on-another-runner"
    new_session = dispatch.runner_id is None and dispatch.kind == "spawn"
    # A spawn this runner leased before (a restart released it) is among the sessions it
    # reports already: counting it again would keep it from taking its own work back.
    taken_before = dispatch.lease_holder == runner.runner_id
    if new_session and not taken_before and runner.sessions >= runner.capacity:
        return "runner-at-capacity"
    if not runner.workspace and dispatch.repository.lower() not in {
        repository.lower() for repository in runner.repositories
    }:
        return "repository-not-served"
    missing = {k: v for k, v in dispatch.labels.items() if runner.labels.get(k) != v}
    return f"labels-missing:{','.join(sorted(missing))}" if missing else None


def choose_dispatch(
    candidates: Sequence[DispatchRecord], runner: RunnerRecord, *, live: Sequence[str]
) -> DispatchRecord | None:
    """Return the oldest candidate ``runner`` may take, or None."""
    return next((d for d in candidates if why_not(d, runner, live=live) is None), None)


def waiting_reasons(
    candidates: Sequence[DispatchRecord], runners: Sequence[RunnerRecord], *, live: Sequence[str]
) -> list[Waiting]:
    """Say, for each candidate no live runner may take, why the first live runner refused it
    (or that no runner is live), so an operator sees what waits and why."""
    live_runners = [r for r in runners if r.runner_id in live]
    waits = []
    for dispatch in candidates:
        reasons = [why_not(dispatch, runner, live=live) for runner in live_runners]
        if not live_runners:
            waits.append(Waiting(dispatch.dispatch_id, "no-live-runner"))
        elif all(reasons):
            waits.append(Waiting(dispatch.dispatch_id, str(reasons[0])))
    return waits
