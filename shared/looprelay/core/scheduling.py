"""Which dispatch a polling runner gets ("Affinity and targeting").

Scenario: work item #7's session lives on runner A. Its next dispatch (seq 5) waits until seq 4
of the same session is settled, then goes to A alone while A is live; if A falls silent past
``lostAfterSeconds``, any eligible runner may take it and respawn the session there. A spawn
goes to a live runner that serves the repository (a checkout of it, or a workspace), carries
every label the dispatch asks for, and has a free session slot (``core.slots``); a pull
request's own session goes only to a runner that can make its checkout. Runners never wait on
each other, and sessions never wait on each other: a pull request's session nobody can take
holds back only that session's later dispatches, not those of the work item's own session.
The one exception is ending them: the stops and cleanups of one work item's sessions go one at
a time (the runner's cleanups of one work item's checkouts must not race each other).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from looprelay.core.model import DISPATCH_OPEN, DispatchRecord, RunnerRecord, WorkItemRecord
from looprelay.core.slots import ENDING_KINDS, can_make_checkout, needs_own_checkout, takes_slot
from looprelay.ports import RunnerStatus


@dataclass(frozen=True)
class Waiting:
    """A dispatch nobody may take right now, and why (for operators)."""

    dispatch_id: str
    reason: str


def is_live(runner: RunnerRecord, *, now: datetime, lost_after: timedelta) -> bool:
    """Whether ``runner`` has been heard from recently and is not revoked (one never heard
    from, ``not-started``, is not live)."""
    seen = runner.last_seen_at
    return not runner.revoked and seen is not None and now - seen <= lost_after


def runner_state(runner: RunnerRecord, *, now: datetime, lost_after: timedelta) -> str:
    """The one word every view uses for ``runner``: ``revoked``, ``not-started`` (registered,
    its agent never heard from), ``live`` or ``lost`` (silent past ``lost_after``)."""
    if runner.revoked:
        return "revoked"
    if runner.last_seen_at is None:
        return "not-started"
    return "live" if is_live(runner, now=now, lost_after=lost_after) else "lost"


def with_last_seen(runner: RunnerRecord, last_seen: datetime | None) -> RunnerRecord:
    """``runner`` last seen at the later of its own ``last_seen_at`` and ``last_seen`` (a
    heartbeat recorded apart from the record); ``runner`` itself when that changes nothing."""
    if last_seen is None or (runner.last_seen_at is not None and runner.last_seen_at >= last_seen):
        return runner
    return runner.model_copy(update={"last_seen_at": last_seen})


def reports_new_status(runner: RunnerRecord, status: RunnerStatus) -> bool:
    """Whether a heartbeat of ``runner`` reporting ``status`` changes what its record says;
    when it does not, only that the runner is alive needs recording (``record_alive``)."""
    held = RunnerStatus(
        version=runner.version,
        capacity=runner.capacity,
        repositories=tuple(runner.repositories),
        workspace=runner.workspace,
        sessions=runner.sessions,
        agent_id=runner.agent_id,
        hostname=runner.hostname,
        harnesses=tuple(runner.harnesses),
    )
    return held != status


def heads_of_line(
    open_dispatches: Iterable[DispatchRecord], *, now: datetime
) -> list[DispatchRecord]:
    """Return, per session endpoint of each work item, its lowest-``seq`` unsettled dispatch
    if it can be leased now (pending, or its lease lapsed), oldest first. Later ones of the
    same endpoint wait their turn; other endpoints do not wait for it."""
    first: dict[tuple[str, str], DispatchRecord] = {}
    for dispatch in open_dispatches:
        if dispatch.status not in DISPATCH_OPEN:
            continue
        line = (dispatch.work_item, dispatch.endpoint)
        held = first.get(line)
        if held is None or dispatch.seq < held.seq:
            first[line] = dispatch
    ending = _first_ending(first.values())
    ready = [
        d
        for d in first.values()
        if _leasable(d, now)
        and (d.kind not in ENDING_KINDS or ending[d.work_item].dispatch_id == d.dispatch_id)
    ]
    return sorted(ready, key=lambda d: (d.created_at, d.seq, d.dispatch_id))


def _first_ending(firsts: Iterable[DispatchRecord]) -> dict[str, DispatchRecord]:
    """Per work item, its lowest-``seq`` stop or cleanup among its endpoints' first open
    dispatches (in flight or not): the only one of them that may go now."""
    ending: dict[str, DispatchRecord] = {}
    for dispatch in firsts:
        held = ending.get(dispatch.work_item)
        if dispatch.kind in ENDING_KINDS and (held is None or dispatch.seq < held.seq):
            ending[dispatch.work_item] = dispatch
    return ending


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


def why_not(
    dispatch: DispatchRecord,
    runner: RunnerRecord,
    *,
    live: Sequence[str],
    holding: Collection[str] | None = None,
) -> str | None:
    """Return why ``runner`` may not take ``dispatch`` (None: it may).

    Expects the ids of the live runners and the session endpoints the server assigned
    ``runner`` (``holding``; None: judge by the count its last heartbeat reported). A spawn
    needs a free slot unless its endpoint already holds one. Never raises.
    """
    if dispatch.runner_id not in (None, runner.runner_id) and dispatch.runner_id in live:
        return "session-on-another-runner"
    # What the runner can never take is said before what it cannot take now (capacity).
    if not runner.workspace and dispatch.repository.lower() not in {
        repository.lower() for repository in runner.repositories
    }:
        return "repository-not-served"
    missing = {k: v for k, v in dispatch.labels.items() if runner.labels.get(k) != v}
    if missing:
        return f"labels-missing:{','.join(sorted(missing))}"
    if not runs_harness(runner, dispatch):
        return f"harness-missing:{dispatch.harness}"
    if needs_own_checkout(dispatch) and not can_make_checkout(runner):
        return "no-separate-checkout"
    return "runner-at-capacity" if _needs_slot(dispatch, runner, holding) else None


def runs_harness(runner: RunnerRecord, dispatch: DispatchRecord) -> bool:
    """Whether ``runner`` can run the harness ``dispatch`` starts or talks to (a stop or a
    cleanup needs none; a runner that never said which it has is taken to have any)."""
    if dispatch.kind not in ("spawn", "deliver") or not runner.harnesses:
        return True
    return dispatch.harness in runner.harnesses


def _needs_slot(
    dispatch: DispatchRecord, runner: RunnerRecord, holding: Collection[str] | None
) -> bool:
    """Whether ``dispatch`` would start a session ``runner`` has no free slot for."""
    if holding is None:
        new_session = dispatch.runner_id is None and dispatch.kind == "spawn"
        return new_session and runner.sessions >= runner.capacity
    starts = takes_slot(dispatch, runner.runner_id) and dispatch.endpoint not in holding
    return starts and len(holding) >= runner.capacity


def choose_dispatch(
    candidates: Sequence[DispatchRecord],
    runner: RunnerRecord,
    *,
    live: Sequence[str],
    holding: Collection[str] | None = None,
) -> DispatchRecord | None:
    """Return the oldest candidate ``runner`` may take, or None; ``holding`` as in
    :func:`why_not`."""
    return next(
        (d for d in candidates if why_not(d, runner, live=live, holding=holding) is None), None
    )


def waiting_reasons(
    candidates: Sequence[DispatchRecord],
    runners: Sequence[RunnerRecord],
    *,
    live: Sequence[str],
    holding: Mapping[str, Collection[str]] | None = None,
) -> list[Waiting]:
    """Say, for each candidate no live runner may take, why the first live runner refused it
    (or that no runner is live), so an operator sees what waits and why. ``holding`` maps a
    runner id to the session endpoints the server gave it (see :func:`why_not`)."""
    live_runners = [r for r in runners if r.runner_id in live]
    waits = []
    for dispatch in candidates:
        reasons = [
            why_not(
                dispatch,
                runner,
                live=live,
                holding=None if holding is None else holding.get(runner.runner_id, ()),
            )
            for runner in live_runners
        ]
        if not live_runners:
            waits.append(Waiting(dispatch.dispatch_id, "no-live-runner"))
        elif all(reasons):
            waits.append(Waiting(dispatch.dispatch_id, str(reasons[0])))
    return waits
