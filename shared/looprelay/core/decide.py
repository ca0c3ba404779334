"""The worker's brain: one envelope and one work item's state in, one ``Decision`` out.

Scenario, for issue #7 with ``requireStartCommand`` on. The label arms it (state ``armed``,
nothing runs). An authorized ``the-loop start`` comment spawns its session with the comment as
the first prompt, and asks for the phase-selection checklist to be posted once. Ordinary
comments from authorized people are delivered into the live session, in order (``seq``); a PR
linked to #7 talks to #7's session or to a session of its own (``sessionPerPr``, the work
item's frozen answer winning). ``the-loop execute`` freezes the selection once and is handed to
the session with the frozen graph as context. ``stop``, ``pause``, ``resume``, ``cleanup`` and
the issue closing change the recorded state and send control dispatches; they are consumed, not
forwarded. The issue author, unlisted, closes #7: nothing changes and the session keeps running
(``closeEndsSession: authorized``, the default; with ``anyone`` the close ends the session and
leaves the cleanup to an authorized person). Anything looprelay wrote itself, or anyone
unlisted wrote, goes nowhere; nor does a listed login that now carries another user id.
"""

from __future__ import annotations

from looprelay.core.answers import ANSWER_KIND, HELD, NOT_AUTHORIZED, answer_for
from looprelay.core.control import (
    Action,
    Command,
    ControlState,
    NoOp,
    Signal,
    Verdict,
    apply_command,
    envelope_labels,
    read_command,
    read_signal,
)
from looprelay.core.decision import CommentPost, Decision, Note, Situation
from looprelay.core.forks import FORK_NOTICE, approve, record_head, tree_head
from looprelay.core.gate import checklist_body, freeze_graph
from looprelay.core.model import (
    DISPATCH_HELD,
    MAX_COMMANDS,
    MAX_LINKED_PULL_REQUESTS,
    CommandLog,
    DispatchRecord,
    WorkItemRecord,
)
from looprelay.core.plan import (
    LIVE_STATUSES,
    MAX_HELD_EVENTS,
    PausedEvents,
    Plan,
    RoutingPolicy,
    Templates,
)
from looprelay.core.policy import (
    LIFECYCLE_EVENTS,
    Authorization,
    authorize,
    drop_reason,
    event_actor,
)
from looprelay.core.prsessions import choose_endpoint, effective_session_per_pr

USER_ID_MISMATCH = "refused:user-id-mismatch"
"""The outcome of an event whose listed login carries another user id than its pin."""


def decide(  # noqa: PLR0911 - one guard per rule, in the documented order
    situation: Situation, policy: RoutingPolicy, templates: Templates
) -> Decision:
    """Decide what one delivery means for its work item.

    Expects the loaded situation (the target work item chosen by the caller among
    ``names.refs``; for ``execute``, the current body of looprelay's own recorded checklist
    comment). Raises ``TemplateError`` for an operator template that cannot render.
    """
    envelope = situation.envelope
    dropped = drop_reason(envelope, bot_logins=policy.bot_logins)
    if dropped is not None:
        return _ignored(f"dropped:{dropped}", Note("routing.dropped", {"reason": str(dropped)}))
    authorization = authorize(
        envelope,
        users=policy.users,
        pinned=situation.pinned_ids,
        close_ends_session=policy.close_ends_session,
    )
    if not authorization.routes:
        return _with_heads(_refused(situation, policy, authorization), situation)
    if situation.target is None:
        return _ignored("no-work-item")
    plan = Plan(
        _linked(situation),
        envelope,
        policy,
        templates,
        situation.now,
        situation.session_seed,
        held=situation.held,
    )
    reading = read_command(envelope, keywords=policy.keywords, authorization=authorization)
    if reading.verdict is Verdict.AMBIGUOUS:
        commands = sorted(str(record.command) for record in reading.records)
        return Decision(
            "refused:control-ambiguous",
            " and ".join(commands),
            notes=(Note("control.ambiguous", {"commands": commands}),),
        )
    if reading.verdict is Verdict.NOT_NEW:
        return _ignored("comment-not-new")
    if reading.verdict is Verdict.COMMAND and reading.command is not None:
        return _answered(_command(plan, situation, reading.command), situation, policy)
    signal = read_signal(
        envelope, auto_execute_label=policy.auto_execute_label, authorization=authorization
    )
    if signal is Signal.CLOSE:
        return _close(plan, situation, authorization)
    if signal is Signal.ARM:
        return _transition(plan, situation, Signal.ARM)
    return _answered(_route(plan, situation), situation, policy)


def _answered(decision: Decision, situation: Situation, policy: RoutingPolicy) -> Decision:
    """``decision`` with the marked answer its comment's author gets when nothing went through
    (paused, not armed, already started): the person on GitHub sees why, not only the ledger."""
    held = any(d.status == DISPATCH_HELD for d in decision.dispatches)
    text = HELD if held else answer_for(decision.detail, label=policy.auto_execute_label)
    if situation.envelope.comment is None or text is None or (decision.dispatches and not held):
        return decision
    return Decision(
        decision.outcome,
        decision.detail,
        decision.work_item,
        decision.dispatches,
        (*decision.comments, CommentPost(ANSWER_KIND, text)),
        decision.notes,
    )


def _refused(situation: Situation, policy: RoutingPolicy, authorization: Authorization) -> Decision:
    envelope = situation.envelope
    actor = event_actor(envelope)
    login = actor.login if actor else None
    if authorization is Authorization.ID_MISMATCH and actor is not None:
        # Whoever holds a released username now is not the person the operator listed.
        pinned = policy.users.pinned_id(actor.login.lower(), pinned=situation.pinned_ids)
        note = Note(
            "routing.dropped",
            {
                "reason": "user-id-mismatch",
                "actor": login,
                "user_id": actor.id,
                "pinned_user_id": pinned,
            },
        )
        detail = f"{login} is pinned to user id {pinned}, but this event's {login} is {actor.id}"
        return Decision(USER_ID_MISMATCH, detail, notes=(note,))
    detail = "actor not in routing.authorizedUsers"
    if envelope.event in LIFECYCLE_EVENTS and envelope.action == "closed":
        detail += "; routing.closeEndsSession is authorized, so the session keeps running"
    note = Note("routing.dropped", {"reason": "unauthorized-actor", "actor": login})
    # Silent by default: a stranger learns nothing of how the repository is driven.
    answer = policy.answer_strangers and envelope.comment is not None
    comments = (CommentPost(ANSWER_KIND, NOT_AUTHORIZED),) if answer else ()
    return Decision("refused:unauthorized-actor", detail, comments=comments, notes=(note,))


def _with_heads(decision: Decision, situation: Situation) -> Decision:
    """``decision`` carrying the event's pull request head into its work item's record.

    A push by a fork's author is refused (the author is not authorized), yet its new head
    must reach the record, or an approval of the old head would keep counting.
    """
    item, pr_ref = situation.work_item, _event_pr_ref(situation)
    if item is None or pr_ref is None or situation.envelope.pull_request is None:
        return decision
    heads = record_head(item.pull_request_heads, pr_ref, situation.envelope.pull_request)
    if heads == item.pull_request_heads:
        return decision
    updated = item.model_copy(update={"pull_request_heads": heads, "updated_at": situation.now})
    return Decision(
        decision.outcome,
        decision.detail,
        updated,
        comments=decision.comments,
        notes=decision.notes,
    )


def _event_pr_ref(situation: Situation) -> str | None:
    """The ref of the pull request this event is on, when it is not the work item itself."""
    target = situation.target.format() if situation.target else None
    return next((ref.format() for ref in situation.names.own if ref.format() != target), None)


def _ignored(detail: str, *notes: Note) -> Decision:
    return Decision("ignored", detail, notes=notes)


def _linked(situation: Situation) -> WorkItemRecord:
    """The target's record (new if needed) with this event's PRs recorded for good."""
    target = situation.target
    assert target is not None  # checked by decide
    item = situation.work_item or WorkItemRecord(
        ref=target.format(), repository=target.repository, number=target.number
    )
    prs = [ref.format() for ref in situation.names.own if ref != target]
    merged = list(dict.fromkeys([*item.pull_requests, *prs]))[:MAX_LINKED_PULL_REQUESTS]
    heads = item.pull_request_heads
    if prs:
        heads = record_head(heads, prs[0], situation.envelope.pull_request)
    return item.model_copy(
        update={"pull_requests": merged, "pull_request_heads": heads, "updated_at": situation.now}
    )


def _command(plan: Plan, situation: Situation, command: Command) -> Decision:
    envelope = situation.envelope
    replayed = next(
        (log for log in plan.item.commands if log.delivery_id == envelope.delivery_id), None
    )
    if replayed is not None:
        # A queue retry of a command already applied (its first attempt saved and has not
        # settled yet): report what it did, change nothing.
        outcome, _, detail = replayed.effect.partition(":")
        return Decision(outcome or "ignored", detail or "command already applied")
    if command is Command.START and _carries_label(situation, plan.policy.auto_execute_label):
        # The label on the issue arms it even when its `labeled` delivery never reached us.
        plan.item = plan.item.model_copy(
            update={"control": str(_armed(ControlState(plan.item.control)))}
        )
    approving = command is Command.START and _fork_pr(plan, situation)
    if approving:
        decision = _approve(plan, situation, approving)
    else:
        decision = _transition(plan, situation, command)
    actor = event_actor(envelope)
    comment = envelope.comment
    log = CommandLog(
        command=str(command),
        actor=actor.login if actor else "",
        at=situation.now,
        delivery_id=envelope.delivery_id,
        comment_id=comment.id if comment else None,
        effect=f"{decision.outcome}:{decision.detail}",
    )
    commands = [*plan.item.commands, log][-MAX_COMMANDS:]
    item = (decision.work_item or plan.item).model_copy(update={"commands": commands})
    note = Note(
        "control.command",
        {
            "command": str(command),
            "actor": log.actor,
            "comment_id": log.comment_id,
            "result": decision.detail,
        },
    )
    return _with_notes(
        Decision(
            decision.outcome,
            decision.detail,
            item,
            decision.dispatches,
            decision.comments,
            decision.notes,
        ),
        note,
    )


def _fork_pr(plan: Plan, situation: Situation) -> str:
    """The ref of the fork pull request this comment is on, or "" (not on one, or its head
    was never seen: an approval needs a sha to pin)."""
    pr_ref = _event_pr_ref(situation)
    state = plan.item.pull_request_heads.get(pr_ref) if pr_ref else None
    if pr_ref is None or state is None or not state.fork:
        return ""
    return pr_ref


def _approve(plan: Plan, situation: Situation, pr_ref: str) -> Decision:
    """An authorized ``start`` on a fork's pull request: approve its head at this moment, and
    route the comment to the pull request's own session when the work item runs."""
    actor = event_actor(situation.envelope)
    state = plan.item.pull_request_heads[pr_ref]
    approved = approve(state, actor=actor.login if actor else "", at=situation.now)
    if approved is None:
        note = Note("pull_request.approval_refused", {"pull_request": pr_ref})
        return Decision("ignored", "fork-head-unknown", plan.item, notes=(note,))
    heads = plan.item.pull_request_heads | {pr_ref: approved}
    plan.item = plan.item.model_copy(update={"pull_request_heads": heads})
    notes = [
        Note(
            "pull_request.fork_approved",
            {"pull_request": pr_ref, "sha": approved.approved_sha, "actor": approved.approved_by},
        )
    ]
    if ControlState(plan.item.control) is not ControlState.STARTED:
        return _finish(plan, [], notes, idle_detail="fork-approved; not-started")
    _route_into(plan, situation, notes)
    return _finish(plan, [], notes, idle_detail="fork-approved")


def _carries_label(situation: Situation, label: str) -> bool:
    return bool(label) and label in envelope_labels(situation.envelope)


def _armed(state: ControlState) -> ControlState:
    return ControlState.ARMED if state in (ControlState.IDLE, ControlState.CLEANED) else state


def _transition(plan: Plan, situation: Situation, step: Command | Signal) -> Decision:
    state = ControlState(plan.item.control)
    own = plan.item.sessions.get(plan.item.ref)
    transition = apply_command(
        state,
        step,
        require_start=plan.policy.require_start,
        session_running=own is not None and own.status in LIVE_STATUSES,
    )
    plan.item = plan.item.model_copy(update={"control": str(transition.state)})
    comments: list[CommentPost] = []
    notes: list[Note] = []
    for effect in transition.effects:
        if isinstance(effect, NoOp):
            notes.append(Note("control.noop", {"step": str(step), "reason": effect.reason}))
            continue
        _apply(plan, situation, effect, comments, notes)
    noop = next((e.reason for e in transition.effects if isinstance(e, NoOp)), "")
    return _finish(plan, comments, notes, idle_detail=noop or str(transition.state))


def _apply(
    plan: Plan,
    situation: Situation,
    action: Action,
    comments: list[CommentPost],
    notes: list[Note],
) -> None:
    if action is Action.SPAWN:
        plan.send(endpoint=plan.item.ref, spawn_fresh=True)
        if plan.item.checklist_comment_id is None:
            comments.append(CommentPost("checklist", checklist_body(plan)))
    elif action is Action.TERMINATE:
        plan.control("terminate", statuses=LIVE_STATUSES, becomes="terminated")
    elif action in (Action.PAUSE, Action.RESUME):
        plan.control(str(action), statuses=LIVE_STATUSES, becomes="live")
    elif action is Action.CLEANUP:
        plan.control(
            "cleanup",
            statuses=frozenset({"pending", "live", "lost", "terminated"}),
            becomes="cleaned",
        )
    elif action is Action.EXECUTE:
        if plan.item.graph is None:
            freeze_graph(plan, situation, comments, notes)
        _route_into(plan, situation, notes)


def _close(plan: Plan, situation: Situation, authorization: Authorization) -> Decision:
    envelope = situation.envelope
    own = [ref.format() for ref in situation.names.own]
    if plan.item.ref not in own:
        # A linked PR closing ends only a session of its own, never its work item's.
        for pr in own:
            plan.end_session(pr)
        return _finish(
            plan,
            [],
            [Note("session.kept_open", {"closed": own})],
            idle_detail="pull-request-closed",
        )
    decision = _transition(plan, situation, Signal.CLOSE)
    if authorization is Authorization.ALLOWED:
        plan.control(
            "cleanup",
            statuses=frozenset({"pending", "live", "lost", "terminated"}),
            becomes="cleaned",
            closing=True,
        )
        return _finish(
            plan, list(decision.comments), list(decision.notes), idle_detail=decision.detail
        )
    actor = envelope.sender.login if envelope.sender else None
    return _with_notes(decision, Note("cleanup.deferred", {"closed_by": actor}))


def _route(plan: Plan, situation: Situation) -> Decision:
    state = ControlState(plan.item.control)
    if state is ControlState.PAUSED:
        if plan.policy.paused_events is PausedEvents.DROP:
            return _finish(plan, [], [], idle_detail="session-paused")
        if len(plan.held) >= MAX_HELD_EVENTS:
            full = Note("routing.dropped", {"reason": "held-full", "held": len(plan.held)})
            return _finish(plan, [], [full], idle_detail="session-paused-full")
        plan.holding = True
    elif state is not ControlState.STARTED:
        return _finish(plan, [], [], idle_detail="not-started")
    notes: list[Note] = []
    _route_into(plan, situation, notes)
    return _finish(plan, [], notes, idle_detail="")


def _route_into(plan: Plan, situation: Situation, notes: list[Note]) -> None:
    envelope = situation.envelope
    pr = envelope.pull_request
    pr_ref = next(
        (ref.format() for ref in situation.names.own if ref.format() != plan.item.ref), None
    )
    frozen = plan.item.graph.session_per_pr if plan.item.graph else None
    state = plan.item.pull_request_heads.get(pr_ref) if pr_ref else None
    choice = choose_endpoint(
        mode=effective_session_per_pr(frozen, operator_default=plan.policy.session_per_pr),
        work_item_ref=plan.item.ref,
        work_item_repository=plan.item.repository,
        pr_ref=pr_ref,
        pr_head_repository=pr.head_repo if pr else None,
        pr_base_repository=pr.base_repo if pr else None,
        pr_is_work_item=pr_ref is None and situation.names.own != (),
        pr_is_fork=state is not None and state.fork,
        pr_checkout_available=situation.pr_checkout_available,
        pr_session_stuck=_stuck(plan, pr_ref, situation),
    )
    head, untrusted = tree_head(state, fork_sessions=plan.policy.fork_sessions)
    notice = FORK_NOTICE if pr_ref and untrusted else ""
    declined = choice.reason if choice.declined else ""
    if choice.endpoint == "pull-request" and head is None:
        declined = untrusted  # a fork head nobody approved runs nowhere
    if declined:
        notes.append(
            Note("session.pr_session_declined", {"pull_request": pr_ref, "reason": declined})
        )
    if choice.endpoint != "pull-request" or head is None or pr_ref is None:
        plan.send(endpoint=plan.item.ref, notice=notice)
        return
    live = plan.item.sessions.get(pr_ref)
    if head.fork and live is not None and live.head != head:
        plan.end_session(pr_ref)  # approved anew at another sha: respawned there
    # A pull request's own session works in the repository the pull request lives in.
    pr_repository = (pr.base_repo or "") if pr else ""
    plan.send(endpoint=pr_ref, repository=pr_repository.lower(), head=head)


def _stuck(plan: Plan, pr_ref: str | None, situation: Situation) -> bool:
    """Whether the PR's own session was queued and has waited past the bound for a runner:
    its events go to the work item's session meanwhile rather than pile up behind it."""
    session = plan.item.sessions.get(pr_ref) if pr_ref else None
    if session is None or session.status != "pending" or session.queued_at is None:
        return False
    return situation.now - session.queued_at >= plan.policy.pr_session_wait


def _finish(
    plan: Plan, comments: list[CommentPost], notes: list[Note], *, idle_detail: str
) -> Decision:
    dispatches = tuple(plan.dispatches)
    for dispatch in dispatches:
        notes.append(
            Note(
                _NOTED.get(dispatch.status, "dispatch.queued"),
                {
                    "dispatch_id": dispatch.dispatch_id,
                    "kind": dispatch.kind,
                    "endpoint": dispatch.endpoint,
                    "seq": dispatch.seq,
                    "interaction": dispatch.interaction,
                },
            )
        )
    detail = ", ".join(_said(d) for d in dispatches) or idle_detail
    return Decision(
        "dispatched" if dispatches else "ignored",
        detail,
        plan.item,
        dispatches,
        tuple(comments),
        tuple(notes),
    )


_NOTED = {DISPATCH_HELD: "dispatch.held", "failed": "dispatch.dropped"}
"""The event a decision's dispatch is logged as, by its status (else ``dispatch.queued``)."""


def _said(dispatch: DispatchRecord) -> str:
    """A dispatch as the ledger's detail names it: ``deliver github:o/r#1``, ``held ...``."""
    status = "" if dispatch.status == "pending" else f"{dispatch.status} "
    return f"{status}{dispatch.kind} {dispatch.endpoint}"


def _with_notes(decision: Decision, *notes: Note) -> Decision:
    return Decision(
        decision.outcome,
        decision.detail,
        decision.work_item,
        decision.dispatches,
        decision.comments,
        (*decision.notes, *notes),
    )
