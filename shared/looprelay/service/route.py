"""The worker's delivery handler: load a work item, decide, save, then tell GitHub.

The decision is made by the pure core (``core.decide``) on what this module loads; the save is
a compare-and-set, so two deliveries for one work item racing through two workers decide again
on the fresh state instead of losing an update. GitHub side effects (comments, reactions) come
after the save and are best effort: they never undo or fail a decision.
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace

from looprelay.config.routing import TemplateSource
from looprelay.core.answers import ANSWER_KIND, ANSWER_REACTION
from looprelay.core.control import Command, ControlState, find_commands
from looprelay.core.decide import USER_ID_MISMATCH, decide
from looprelay.core.decision import CommentPost, Decision, Situation
from looprelay.core.envelope import Envelope
from looprelay.core.model import (
    DISPATCH_HELD,
    DISPATCH_OPEN,
    MAX_APPLIED,
    MAX_DETAIL_CHARS,
    AppliedDelivery,
    DeliveryRecord,
    DispatchRecord,
    EventRecord,
    WorkItemRecord,
)
from looprelay.core.plan import RoutingPolicy
from looprelay.core.policy import pin_to_record
from looprelay.core.sameevent import SAME_EVENT, EventIdentity, applied_before, event_identity
from looprelay.core.slots import can_make_checkout
from looprelay.core.workitems import WorkItemRef, parse_ref, work_items
from looprelay.errors import Permanent, Transient
from looprelay.ports import Clock, GitHub, RunnerRegistry, Store, WorkItemStore
from looprelay.service.besteffort import best_effort
from looprelay.service.comments import post_once
from looprelay.service.worker import Outcome

log = logging.getLogger("looprelay.service.route")

MAX_SAVE_ROUNDS = 8
"""Decide-and-save rounds on one contended work item before the queue is asked to retry."""
"""Runner label (``workspace=true``) an operator sets to say a runner can give a pull request
its own checkout, besides the workspace root the runner itself reports (``RunnerRecord``)."""


class Router:
    """Routes deliveries to sessions; one instance serves many threads."""

    def __init__(
        self,
        *,
        store: Store,
        work_items: WorkItemStore,
        runners: RunnerRegistry,
        github: GitHub | None,
        policy: RoutingPolicy,
        templates: TemplateSource,
        clock: Clock,
        on_dispatch: Callable[[Sequence[DispatchRecord]], None] = lambda _dispatches: None,
    ) -> None:
        self._store = store
        self._items = work_items
        self._runners = runners
        self._github = github
        self._policy = policy
        self._templates = templates
        self._clock = clock
        self._on_dispatch = on_dispatch

    def __call__(self, envelope: Envelope, record: DeliveryRecord) -> Outcome:
        """Handle one delivery (handed off in its group's order by ``service.inbox``); raises
        ``Transient`` when the store or GitHub must be retried."""
        pinned = self._pin(envelope)
        identity = event_identity(envelope)
        for _ in range(MAX_SAVE_ROUNDS):
            situation = self._load(envelope, pinned)
            applied = _applied(situation.work_item, envelope.delivery_id)
            if situation.work_item is not None and applied is not None:
                return self._replay(envelope, situation.work_item, applied)
            if situation.work_item is not None:
                same = applied_before(identity, situation.work_item.applied)
                if same is not None:
                    return _same_event(envelope, same)
                situation = _without_applied_parts(situation, situation.work_item)
            decision = decide(situation, self._policy, self._templates.for_decision())
            if decision.work_item is None or self._save(situation, decision, identity):
                break
        else:
            raise Transient("work item stayed contended; the queue will retry")
        self._record_notes(envelope, decision)
        if decision.outcome == USER_ID_MISMATCH:
            log.warning("refused: %s", decision.detail, extra={"delivery_id": envelope.delivery_id})
        self._ring(decision.dispatches)
        if decision.work_item is not None:
            self._tell_github(envelope, decision.work_item, decision)
        elif decision.comments and situation.work_item is not None:
            # A refusal answered (routing.answerStrangers) writes nothing to the work item.
            self._tell_github(envelope, situation.work_item, decision)
        return Outcome(decision.outcome, decision.detail)

    def _ring(self, dispatches: Sequence[DispatchRecord]) -> None:
        """Tell the polls of the dispatches a runner may take now; a held or dropped one
        wakes none."""
        takeable = [d for d in dispatches if d.status in DISPATCH_OPEN]
        if takeable:
            self._on_dispatch(takeable)

    def _pin(self, envelope: Envelope) -> dict[str, int]:
        """The first-sight pin of the actor's login, made now if this event is its first
        sight (a login listed alone in ``routing.authorizedUsers``); empty otherwise."""
        wanted = pin_to_record(envelope, users=self._policy.users)
        if wanted is None:
            return {}
        pinned, created = self._store.pin_user_id(
            wanted.login, user_id=wanted.user_id, at=self._clock.now()
        )
        if created:
            log.info(
                "pinned %s to user id %d on first sight",
                wanted.login,
                pinned,
                extra={"delivery_id": envelope.delivery_id},
            )
            self._store.append_event(
                EventRecord(
                    name="routing.user_pinned",
                    at=self._clock.now(),
                    delivery_id=envelope.delivery_id,
                    data={"login": wanted.login, "user_id": pinned},
                )
            )
        return {wanted.login: pinned}

    def _load(self, envelope: Envelope, pinned: Mapping[str, int]) -> Situation:
        names = work_items(envelope)
        bound = next(
            (
                found
                for ref in names.own
                if (found := self._items.find_work_item_for_pull_request(ref.format()))
            ),
            None,
        )
        if bound is not None:
            names = work_items(envelope, recorded={parse_ref(bound.ref)})
        target, item = self._target(
            names.refs, [link.ref for link in names.linked if link.weak], bound
        )
        return Situation(
            envelope=envelope,
            names=names,
            target=target,
            work_item=item,
            now=self._clock.now(),
            session_seed=uuid.uuid4().hex,
            recorded_checklist_body=self._checklist_body(envelope, item),
            pr_checkout_available=self._pr_checkouts(item),
            pinned_ids=pinned,
            held=self._held(item),
        )

    def _held(self, item: WorkItemRecord | None) -> tuple[DispatchRecord, ...]:
        """The held dispatches of ``item``, read only while it is paused (none else)."""
        if item is None or item.control != ControlState.PAUSED:
            return ()
        held = self._items.list_dispatches(statuses=(DISPATCH_HELD,), work_item=item.ref)
        return tuple(sorted(held, key=lambda d: d.seq))

    def _target(
        self,
        refs: tuple[WorkItemRef, ...],
        weak: list[WorkItemRef],
        bound: WorkItemRecord | None,
    ) -> tuple[WorkItemRef | None, WorkItemRecord | None]:
        """The first candidate with a record wins; else the first not named by a branch
        name alone (a branch can invent an issue number)."""
        if bound is not None:
            return parse_ref(bound.ref), bound
        for ref in refs:
            existing = self._items.get_work_item(ref.format())
            if existing is not None:
                return ref, existing
        strong = [ref for ref in refs if ref not in weak]
        candidates = strong or list(refs)
        return (candidates[0] if candidates else None), None

    def _checklist_body(self, envelope: Envelope, item: WorkItemRecord | None) -> str | None:
        comment = envelope.comment
        if item is None or item.graph is not None or item.checklist_comment_id is None:
            return None
        if comment is None or Command.EXECUTE not in find_commands(
            comment.body, self._policy.keywords
        ):
            return None
        if self._github is None:
            return None
        try:
            text = self._github.get_comment(
                installation_id=envelope.installation_id,
                repository=item.repository,
                comment_id=item.checklist_comment_id,
            )
        except Permanent as exc:
            log.warning("checklist comment unreadable, defaults apply: %s", exc)
            return None
        return text.body if text else None

    def _pr_checkouts(self, item: WorkItemRecord | None) -> bool:
        """Whether a runner can give a pull request of ``item`` a checkout of its own: the
        PR's spawn goes only to such a runner (``core.scheduling.why_not``), so it is judged
        for any runner that may take it, not only the one the work item's session is on.
        None registered: the PR's events go to the work item's session, declined."""
        session = item.sessions.get(item.ref) if item else None
        runner = (
            self._runners.get_runner(session.runner_id) if session and session.runner_id else None
        )
        if runner is not None and can_make_checkout(runner):
            return True  # one read: the session's own runner can, as it mostly does
        if item is None:
            return False
        return self._runners.find_checkout_runner() is not None

    def _save(
        self, situation: Situation, decision: Decision, identity: EventIdentity | None
    ) -> bool:
        assert decision.work_item is not None
        expected = situation.work_item.version if situation.work_item else 0
        entry = AppliedDelivery(
            delivery_id=situation.envelope.delivery_id,
            outcome=decision.outcome,
            detail=decision.detail[:MAX_DETAIL_CHARS],
            dispatch_ids=[d.dispatch_id for d in decision.dispatches],
            event_key=identity.key if identity else "",
            event_at=identity.at if identity else None,
        )
        # A joined part is applied with its turn: a retry of it alone, or the poll of its
        # comment, finds it here and is not pasted twice.
        parts = [_applied_part(entry, part) for part in situation.envelope.joined]
        applied = [*decision.work_item.applied, *parts, entry][-MAX_APPLIED:]
        return self._items.save_work_item(
            decision.work_item.model_copy(update={"applied": applied}),
            expected_version=expected,
            dispatches=decision.dispatches,
        )

    def _replay(
        self, envelope: Envelope, item: WorkItemRecord, applied: AppliedDelivery
    ) -> Outcome:
        """A retry of a delivery this work item's save already carried (the worker died before
        the ledger settled it, or it is still running): deciding again on the moved state would
        give another answer (a second dispatch, or "already started"), so report the recorded
        one. Only the 👀 reaction is redone (GitHub keeps one per user); comments are not,
        since the first attempt may still be posting them (at most once)."""
        log.info(
            "delivery already applied to %s; replaying its outcome",
            item.ref,
            extra={"delivery_id": envelope.delivery_id},
        )
        dispatches = tuple(
            found for key in applied.dispatch_ids if (found := self._items.get_dispatch(key))
        )
        self._ring(dispatches)
        decision = Decision(applied.outcome, applied.detail, item, dispatches)
        self._tell_github(envelope, item, decision)
        return Outcome(applied.outcome, applied.detail)

    def _record_notes(self, envelope: Envelope, decision: Decision) -> None:
        work_item = decision.work_item.ref if decision.work_item else None
        now = self._clock.now()
        for note in decision.notes:
            self._store.append_event(
                EventRecord(
                    name=note.name,
                    at=now,
                    delivery_id=envelope.delivery_id,
                    work_item=work_item,
                    data=dict(note.data),
                )
            )

    def _tell_github(self, envelope: Envelope, item: WorkItemRecord, decision: Decision) -> None:
        github = self._github
        if github is None:
            return

        def effect(call: Callable[[], object]) -> None:
            best_effort(
                call,
                store=self._store,
                clock=self._clock,
                delivery_id=envelope.delivery_id,
                work_item=item.ref,
            )

        for post in decision.comments:
            effect(lambda post=post: self._post(envelope, item, post))  # type: ignore[misc]
        comment = envelope.comment
        # This event's own first dispatch: a resume also carries older held ones.
        first = next(
            (d for d in decision.dispatches if d.delivery_id == envelope.delivery_id), None
        )
        # A review's body takes no reaction (GitHub reacts to comments only).
        answered = envelope.event != "pull_request_review" and any(
            post.kind == ANSWER_KIND for post in decision.comments
        )
        if comment is not None and (answered or (first is not None and first.comment_id)):
            kind = "review" if envelope.event == "pull_request_review_comment" else "issue"
            effect(
                lambda: github.add_reaction(
                    installation_id=envelope.installation_id,
                    repository=item.repository,
                    comment_id=comment.id,
                    comment_kind=(first.comment_kind if first else None) or kind,
                    # A held comment is answered, yet it will go through: 👀.
                    content=ANSWER_REACTION if answered and first is None else "eyes",
                )
            )

    def _post(self, envelope: Envelope, item: WorkItemRecord, post: CommentPost) -> None:
        assert self._github is not None
        # One checklist per work item; one confirmation per delivery: the marker carries the id
        # so a retried delivery finds its comment instead of posting it twice.
        marker_id = (
            "wi-" + hashlib.sha256(item.ref.encode()).hexdigest()[:16]
            if post.kind == "checklist"
            else envelope.delivery_id
        )
        comment_id = post_once(
            self._github,
            installation_id=envelope.installation_id,
            repository=item.repository,
            number=item.number,
            body=post.body,
            kind=post.kind,
            marker_id=marker_id,
            bot_logins=self._policy.bot_logins,
        )
        if post.kind == "checklist":
            self._remember_checklist(item.ref, comment_id)

    def _remember_checklist(self, ref: str, comment_id: int) -> None:
        for _ in range(MAX_SAVE_ROUNDS):
            item = self._items.get_work_item(ref)
            if item is None or item.checklist_comment_id is not None:
                return
            updated = item.model_copy(update={"checklist_comment_id": comment_id})
            if self._items.save_work_item(updated, expected_version=item.version):
                return


def _same_event(envelope: Envelope, same: AppliedDelivery) -> Outcome:
    """The event came through the other front door too (webhook and poll): applied once."""
    log.info(
        "the same event as delivery %s, already applied",
        same.delivery_id,
        extra={"delivery_id": envelope.delivery_id},
    )
    return Outcome(SAME_EVENT, f"the same event as delivery {same.delivery_id}")


def _applied_part(entry: AppliedDelivery, part: Envelope) -> AppliedDelivery:
    """``entry`` (its turn's lead's) as the record of ``part``, joined to that turn."""
    identity = event_identity(part)
    return entry.model_copy(
        update={
            "delivery_id": part.delivery_id,
            "event_key": identity.key if identity else "",
            "event_at": identity.at if identity else None,
        }
    )


def _without_applied_parts(situation: Situation, item: WorkItemRecord) -> Situation:
    """``situation`` without the joined parts ``item`` already applied (alone, or through the
    poller under another delivery id)."""
    joined = situation.envelope.joined
    fresh = [
        part
        for part in joined
        if _applied(item, part.delivery_id) is None
        and applied_before(event_identity(part), item.applied) is None
    ]
    if len(fresh) == len(joined):
        return situation
    return replace(situation, envelope=situation.envelope.model_copy(update={"joined": fresh}))


def _applied(item: WorkItemRecord | None, delivery_id: str) -> AppliedDelivery | None:
    if item is None:
        return None
    return next((entry for entry in item.applied if entry.delivery_id == delivery_id), None)
