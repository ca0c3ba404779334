"""Which session slots a dispatch takes and frees ("Session capacity"): one table for every path.

A runner's capacity counts what runs on it: one slot per harness process for a tmux session
(from its spawn until it is stopped, cleaned up, fails to spawn, exits or moves away), one per
turn in flight for a headless (``process``) session, which runs nothing between turns.

Scenario: runner A (capacity 1) hosts #7's tmux session. A falls silent; a comment on #7 is
leased by B, which respawns the session there. That lease takes B's slot and frees A's in one
write, so when A comes back and stops its copy (``moved``) both runners count what they run.
A headless session of #8 on A takes A's slot for each turn's lease and gives it back when the
turn's result comes in, so #9's turn can run on A between two of #8's.

The store holds the slots (``WorkItemStore.held_sessions``) so that a lease can check and take
one in its own write; what the server believes runs (:func:`believed_slots`, from the session
records and the leases in flight) is what they must equal, and the tests check that they do.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from looprelay.core.model import DispatchRecord, RunnerRecord, WorkItemRecord

WORKSPACE_LABEL = "workspace"
"""A runner label (``workspace=true``) saying it can make a checkout per session."""
TURN_KINDS = frozenset({"spawn", "deliver"})
"""Dispatches that run a headless turn (or start, or move, a tmux harness)."""
ENDING_KINDS = frozenset({"terminate", "cleanup"})
"""Dispatches whose settling ends a session on its runner."""
HEADLESS = "process"


def takes_slot(dispatch: DispatchRecord, runner_id: str) -> bool:
    """Whether leasing ``dispatch`` to ``runner_id`` starts a harness there, so needs a slot.

    A spawn starts one; so does a delivery to a tmux session recorded on another runner (the
    runner respawns it: failover), and every headless turn. Never raises.
    """
    if dispatch.runner_kind == HEADLESS:
        return dispatch.kind in TURN_KINDS
    if dispatch.kind == "spawn":
        return True
    return dispatch.kind == "deliver" and dispatch.runner_id not in (None, runner_id)


def frees_on_lease(
    dispatch: DispatchRecord, runner_id: str, *, session_runner: str | None
) -> tuple[str, ...]:
    """The runners whose slot of ``dispatch``'s endpoint a lease to ``runner_id`` frees, in
    the lease's own write: the one that held it before (its lease lapsed, or it left a retry)
    and, for a tmux session moving here, the runner it lived on (``session_runner``)."""
    if not takes_slot(dispatch, runner_id):
        return ()
    before = {dispatch.lease_holder}
    if dispatch.runner_kind != HEADLESS:
        before.add(session_runner)
    return tuple(sorted(r for r in before if r is not None and r != runner_id))


def frees_on_settle(dispatch: DispatchRecord, final_status: str) -> bool:
    """Whether ``dispatch`` settling as ``final_status`` (``succeeded``, ``failed``, or
    ``pending`` for another try) frees its runner's slot of the endpoint.

    A headless turn frees it whatever came of it; a stop or a cleanup when it is final (the
    session is recorded ended either way); a tmux spawn, or a delivery that respawned, when it
    failed for good (the session is recorded lost).
    """
    if dispatch.runner_kind == HEADLESS and dispatch.kind in TURN_KINDS:
        return True
    if final_status == "pending":
        return False
    if dispatch.kind in ENDING_KINDS:
        return True
    return dispatch.kind in TURN_KINDS and final_status == "failed"


def can_make_checkout(runner: RunnerRecord) -> bool:
    """Whether ``runner`` can give a pull request a checkout of its own (a workspace root)."""
    return runner.workspace or runner.labels.get(WORKSPACE_LABEL) == "true"


def needs_own_checkout(dispatch: DispatchRecord) -> bool:
    """Whether ``dispatch`` spawns a pull request's own session (its endpoint is not the work
    item), which only a runner that :func:`can_make_checkout` may take."""
    return dispatch.kind == "spawn" and dispatch.endpoint != dispatch.work_item


@dataclass(frozen=True)
class BelievedSlot:
    """A slot the server believes taken: the runner, the endpoint and its work item."""

    runner_id: str
    endpoint: str
    work_item: str


def believed_slots(
    work_items: Mapping[str, WorkItemRecord], leased: Iterable[DispatchRecord]
) -> set[BelievedSlot]:
    """The slots that what the server believes runs takes: every live tmux session on its
    runner, and every lease in flight that took one (a spawn, a move, a headless turn).
    ``leased`` are the dispatches leased now. Never raises."""
    slots = {
        BelievedSlot(session.runner_id, session.endpoint, item.ref)
        for item in work_items.values()
        for session in item.sessions.values()
        if session.runner_id and session.status == "live" and session.runner_kind != HEADLESS
    }
    for dispatch in leased:
        holder = dispatch.lease_holder
        if dispatch.status == "leased" and holder and takes_slot(dispatch, holder):
            slots.add(BelievedSlot(holder, dispatch.endpoint, dispatch.work_item))
    return slots
