"""The operator's status view: who runs what, where to attach, what waits and why, what failed
and the command that replays it. Values in, one :class:`StatusView` out.

The view names only what an operator needs: ids, names, states, times, reasons and commands.
No prompt, comment body or secret (hash) is ever copied into it, so no renderer can leak one.
"""

from __future__ import annotations

import shlex
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from pydantic import BaseModel, ConfigDict, Field

from looprelay.core.attach import attach_command, runner_socket
from looprelay.core.model import (
    DeliveryRecord,
    DispatchRecord,
    RunnerRecord,
    SessionRecord,
    WorkItemRecord,
)
from looprelay.core.poll import PollCursor, PollRow, poll_rows
from looprelay.core.scheduling import runner_state, waiting_reasons
from looprelay.core.workitems import parse_ref

AFTER_EARLIER = "after-earlier-dispatch-of-its-session"
"""Why a pending dispatch that is not its work item's head waits."""
INTERRUPTED = "interrupted"
"""The result a runner reports for a dispatch it may have half applied (at most once)."""
DETAIL_CHARS = 200
"""How much of a free-text detail the view keeps (a failed turn's message, a dead letter's
exception): enough to see what happened, never a whole document."""
ATTACHABLE = frozenset({"live", "lost"})
"""Session states whose tmux session may still be there to attach to."""
AWAITING_INPUT = "awaiting-input"
"""The state of a live session that asked a question (``looprelay session ask``) no human
has answered yet."""
LIVE_STATES = frozenset({"live", AWAITING_INPUT})
TURN_RUNNING = "turn running"
"""A session's recorded activity while its headless turn runs (``service.session_comments``)."""


EXITED = "exited"
"""A session whose runner reports its harness ended: its slot is free, ``start`` respawns it."""
HARNESS_FAILED = "harness-failed"
"""The one result reason for a harness that died where it should run (in a (re)spawn's probe,
before a paste) or whose headless turn failed; such a tmux session is shown ``exited``."""


def harness_state(harness: str, *, exit_status: int | None, since: datetime | None) -> str:
    """The words every view (``status``, ``/status``, ``runner status``) uses for a harness's
    state: ``running``, ``idle`` (headless, between turns), ``exited (status N, since T)``
    (either part left out when unknown), ``unknown`` for a state nobody reported. Never
    raises."""
    if harness != EXITED:
        return harness or "unknown"
    known = [f"status {exit_status}"] if exit_status is not None else []
    if since is not None:
        known.append(f"since {since.astimezone(UTC).strftime('%Y-%m-%dT%H:%M:%SZ')}")
    return f"{EXITED} ({', '.join(known)})" if known else EXITED


def session_state(session: SessionRecord) -> str:
    """A session's state as every view shows it: its status, ``awaiting-input`` for a live
    session that asked a question no human answered yet, an exited one with its exit status
    and since when (:func:`harness_state`)."""
    if session.status == EXITED:
        return harness_state(EXITED, exit_status=session.exit_status, since=session.exited_at)
    asked = session.status == "live" and session.awaiting_input_at is not None
    return AWAITING_INPUT if asked else session.status


class _Row(BaseModel):
    model_config = ConfigDict(frozen=True)


class RunnerRow(_Row):
    """One registered runner: its state, capacity and use, never its secret."""

    runner_id: str
    name: str
    state: str
    """``not-started`` (registered, its agent never heard from), ``live``, ``lost`` (silent
    past ``runners.lostAfterSeconds``) or ``revoked`` (``core.scheduling.runner_state``)."""
    capacity: int
    sessions: int
    last_seen_at: datetime | None
    version: str
    hostname: str = ""
    repositories: list[str]
    workspace: bool
    labels: dict[str, str]
    harnesses: list[str] = []
    """The coding-agent CLIs its agent reported (empty: not said, any)."""


class SessionRow(_Row):
    """One session of a work item: where it runs and how to watch it."""

    work_item: str
    work_item_url: str = ""
    """The work item's page on GitHub ("" when its ref names none)."""
    endpoint_url: str = ""
    control: str
    endpoint: str
    session: str
    state: str
    """``pending``, ``live``, ``exited (status N, since T)`` (:func:`session_state`), ``lost``,
    ``terminated`` or ``cleaned``."""
    exit_status: int | None = None
    exited_at: datetime | None = None
    runner_id: str | None
    runner: str | None
    harness: str
    runner_kind: str
    attach: str | None
    """The shell command that attaches to it, on the runner's machine (tmux sessions that may
    still be there)."""
    awaiting_input_since: datetime | None = None
    """When it asked the question it waits on (state ``awaiting-input``)."""
    activity: str = ""
    """What it last did and when, for a person: ``pasted 2 m ago``, ``turn running 40 s``."""


class DispatchRow(_Row):
    """One open dispatch and, when nobody may take it now, why it waits."""

    dispatch_id: str
    work_item: str
    endpoint: str
    seq: int
    kind: str
    status: str
    runner: str | None
    attempts: int
    created_at: datetime
    waiting: str | None


class DeliveryRow(_Row):
    """One ledger record: a delivery GitHub made and what became of it."""

    delivery_id: str
    event: str
    action: str | None
    outcome: str
    detail: str
    attempts: int
    received_at: datetime
    settled_at: datetime | None
    subject: str = ""
    """The issue or pull request it is about (``owner/repo#N``), "" when none."""
    subject_url: str = ""


class ReplayRow(_Row):
    """A dead letter or an interrupted dispatch, and the command that replays it."""

    kind: str
    """``delivery`` (a failed delivery) or ``dispatch`` (an interrupted one)."""
    id: str
    subject: str
    """The event of a delivery, the work item of a dispatch."""
    at: datetime | None
    detail: str
    command: str


class Totals(_Row):
    """The counts the page's first line gives."""

    runners_live: int
    runners: int
    sessions_live: int
    dispatches_open: int
    dispatches_waiting: int
    dead_letters: int
    interrupted: int


class StatusView(_Row):
    """Everything the status page, its JSON and ``looprelay status`` show."""

    generated_at: datetime
    totals: Totals
    runners: list[RunnerRow]
    sessions: list[SessionRow]
    dispatches: list[DispatchRow]
    deliveries: list[DeliveryRow]
    replays: list[ReplayRow]
    polling: list[PollRow] = Field(default_factory=list)
    """Each polled repository: how far behind the poll ingress is (``core.poll``)."""


@dataclass(frozen=True)
class StatusInputs:
    """What the view is built from, as read through the ports.

    ``heads`` are the dispatches that may be leased now (``leases.leasable_heads``);
    ``command_args`` go after every replay command (``--data DIR`` for a local store).
    """

    runners: Sequence[RunnerRecord]
    work_items: Sequence[WorkItemRecord]
    open_dispatches: Sequence[DispatchRecord]
    heads: Sequence[DispatchRecord]
    deliveries: Sequence[DeliveryRecord]
    dead_letters: Sequence[DeliveryRecord]
    failed_dispatches: Sequence[DispatchRecord]
    command_args: Sequence[str] = ()
    holding: Mapping[str, Collection[str]] = field(default_factory=dict)
    """Runner id -> the session endpoints the server gave it (its used capacity)."""
    poll_cursors: Sequence[PollCursor] = ()


def build_status(inputs: StatusInputs, *, now: datetime, lost_after: timedelta) -> StatusView:
    """Build the view of ``inputs`` as of ``now`` (aware). Never raises."""
    runner_states = {r.runner_id: _runner_state(r, now, lost_after) for r in inputs.runners}
    live = [runner_id for runner_id, state in runner_states.items() if state == "live"]
    names = {r.runner_id: r.name for r in inputs.runners}
    waits = explain_waits(
        inputs.open_dispatches, inputs.heads, inputs.runners, live=live, holding=inputs.holding
    )
    sessions = [
        _session_row(item, session, names, now)
        for item in inputs.work_items
        for session in item.sessions.values()
    ]
    replays = [_dead_letter_row(d, inputs.command_args) for d in inputs.dead_letters] + [
        _interrupted_row(d, inputs.command_args)
        for d in inputs.failed_dispatches
        if d.result == INTERRUPTED
    ]
    dispatches = [_dispatch_row(d, waits.get(d.dispatch_id)) for d in inputs.open_dispatches]
    return StatusView(
        generated_at=now,
        totals=Totals(
            runners_live=len(live),
            runners=len(inputs.runners),
            sessions_live=sum(1 for s in sessions if s.state in LIVE_STATES),
            dispatches_open=len(dispatches),
            dispatches_waiting=sum(1 for d in dispatches if d.waiting),
            dead_letters=sum(1 for r in replays if r.kind == "delivery"),
            interrupted=sum(1 for r in replays if r.kind == "dispatch"),
        ),
        runners=[
            _runner_row(r, runner_states[r.runner_id], inputs.holding.get(r.runner_id))
            for r in inputs.runners
        ],
        sessions=sessions,
        dispatches=dispatches,
        deliveries=[delivery_row(d) for d in inputs.deliveries],
        replays=replays,
        polling=poll_rows(inputs.poll_cursors, now=now),
    )


def explain_waits(
    open_dispatches: Sequence[DispatchRecord],
    heads: Sequence[DispatchRecord],
    runners: Sequence[RunnerRecord],
    *,
    live: Sequence[str],
    holding: Mapping[str, Collection[str]] | None = None,
) -> dict[str, str]:
    """Say, by dispatch id, why each open dispatch nobody may take now waits: the reason the
    runners refuse a head of line, or that an earlier dispatch of its session goes first.
    ``holding`` is as ``core.scheduling.waiting_reasons`` takes it."""
    reasons = waiting_reasons(heads, runners, live=live, holding=holding)
    waits = {w.dispatch_id: w.reason for w in reasons}
    head_ids = {d.dispatch_id for d in heads}
    for dispatch in open_dispatches:
        behind = dispatch.status == "pending" and dispatch.dispatch_id not in head_ids
        if behind and dispatch.dispatch_id not in waits:
            waits[dispatch.dispatch_id] = AFTER_EARLIER
    return waits


def _runner_state(runner: RunnerRecord, now: datetime, lost_after: timedelta) -> str:
    return runner_state(runner, now=now, lost_after=lost_after)


def _runner_row(runner: RunnerRecord, state: str, held: Collection[str] | None) -> RunnerRow:
    return RunnerRow(
        runner_id=runner.runner_id,
        name=runner.name,
        state=state,
        capacity=runner.capacity,
        # The server's own count when known (capacity is judged by it), else the heartbeat's.
        sessions=len(held) if held is not None else runner.sessions,
        last_seen_at=runner.last_seen_at,
        version=runner.version,
        hostname=runner.hostname,
        repositories=list(runner.repositories),
        workspace=runner.workspace,
        labels=dict(runner.labels),
        harnesses=list(runner.harnesses),
    )


def _session_row(
    item: WorkItemRecord, session: SessionRecord, names: Mapping[str, str], now: datetime
) -> SessionRow:
    attach = None
    if session.runner_kind == "tmux" and session.runner_id and session.status in ATTACHABLE:
        socket = session.tmux_socket or runner_socket(session.runner_id)
        attach = attach_command(socket=socket, session=session.session_name)
    return SessionRow(
        work_item=item.ref,
        work_item_url=web_url(item.ref),
        endpoint_url=web_url(session.endpoint),
        control=item.control,
        endpoint=session.endpoint,
        session=session.session_name,
        state=session_state(session),
        exit_status=session.exit_status,
        exited_at=session.exited_at,
        runner_id=session.runner_id,
        runner=names.get(session.runner_id or ""),
        harness=session.harness,
        runner_kind=session.runner_kind,
        attach=attach,
        awaiting_input_since=session.awaiting_input_at,
        activity=_activity(session, now),
    )


def _activity(session: SessionRecord, now: datetime) -> str:
    """``session``'s last activity for a person: a turn still running says for how long."""
    if not session.activity or session.active_at is None:
        return ""
    span = duration_text(now - session.active_at)
    if session.activity == TURN_RUNNING and session.status == "live":
        return f"{TURN_RUNNING} {span}"
    return f"{session.activity} {span} ago"


def duration_text(span: timedelta) -> str:
    """``span`` in its largest whole unit: ``40 s``, ``2 m``, ``3 h``, ``5 d`` (0 s at least)."""
    seconds = max(0, int(span.total_seconds()))
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size} {unit}"
    return f"{seconds} s"


def _dispatch_row(dispatch: DispatchRecord, waiting: str | None) -> DispatchRow:
    return DispatchRow(
        dispatch_id=dispatch.dispatch_id,
        work_item=dispatch.work_item,
        endpoint=dispatch.endpoint,
        seq=dispatch.seq,
        kind=dispatch.kind,
        status=dispatch.status,
        runner=dispatch.lease_holder or dispatch.runner_id,
        attempts=dispatch.attempts,
        created_at=dispatch.created_at,
        waiting=waiting,
    )


def web_url(ref: str) -> str:
    """The GitHub page of work-item ref ``ref`` (``github:owner/repo#N``), "" for no ref."""
    try:
        return parse_ref(ref).web_url()
    except ValueError:
        return ""


def _subject_url(subject: str) -> str:
    return web_url(f"github:{subject}") if subject else ""


def delivery_row(delivery: DeliveryRecord) -> DeliveryRow:
    """The view's row of one ledger record."""
    return DeliveryRow(
        delivery_id=delivery.delivery_id,
        event=delivery.event,
        action=delivery.action,
        outcome=delivery.outcome,
        detail=short_text(delivery.detail),
        attempts=delivery.attempts,
        received_at=delivery.received_at,
        settled_at=delivery.settled_at,
        subject=delivery.order_group,
        subject_url=_subject_url(delivery.order_group),
    )


def _dead_letter_row(delivery: DeliveryRecord, args: Sequence[str]) -> ReplayRow:
    return ReplayRow(
        kind="delivery",
        id=delivery.delivery_id,
        subject=delivery.event,
        at=delivery.settled_at or delivery.received_at,
        detail=short_text(delivery.detail),
        command=_command(["deliveries", "replay", delivery.delivery_id], args),
    )


def _interrupted_row(dispatch: DispatchRecord, args: Sequence[str]) -> ReplayRow:
    return ReplayRow(
        kind="dispatch",
        id=dispatch.dispatch_id,
        subject=dispatch.work_item,
        at=dispatch.updated_at or dispatch.created_at,
        detail=short_text(dispatch.detail),
        command=_command(["dispatches", "resend", dispatch.dispatch_id], args),
    )


def _command(words: Sequence[str], args: Sequence[str]) -> str:
    return shlex.join(["looprelay", *words, *args])


def short_text(text: str) -> str:
    """``text`` on one line, at most :data:`DETAIL_CHARS` characters."""
    one_line = " ".join(text.split())
    return one_line if len(one_line) <= DETAIL_CHARS else one_line[: DETAIL_CHARS - 1] + "…"
