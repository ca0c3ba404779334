"""Building what a decision writes: sessions, dispatches and prompts for one work item.

Pure: ids are derived from the delivery and the endpoint (a redelivered event derives the same
dispatch, which the store then leaves alone), a fresh session's id is a UUIDv5 of a random seed the
caller draws per delivery, the endpoint and the sequence number, and time comes in as an argument.
"""

from __future__ import annotations

import hashlib
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from enum import StrEnum

from looprelay.core.checklist import Phase
from looprelay.core.control import Keywords, envelope_labels
from looprelay.core.envelope import Envelope
from looprelay.core.excerpt import render_excerpt, wrap_untrusted
from looprelay.core.forks import ForkSessions
from looprelay.core.interaction import ModeResolution
from looprelay.core.model import (
    DISPATCH_HELD,
    MAX_SESSIONS,
    DispatchRecord,
    GraphRecord,
    PullRequestHead,
    SessionRecord,
    WorkItemRecord,
)
from looprelay.core.policy import AuthorizedUsers, CloseEndsSession
from looprelay.core.prsessions import SessionPerPr, tmux_session_name
from looprelay.core.render import PromptContext, render_prompt

_SESSION_NAMESPACE = uuid.UUID("6f1e7d0a-3c55-4c4e-9a8e-6c1f2b0d9a11")
LIVE_STATUSES = frozenset({"pending", "live"})
"""A session in one of these receives deliveries; any other status needs a (re)spawn."""
RESUMABLE_STATUSES = frozenset({"lost", "terminated", "exited"})
"""A session in one of these has a conversation a (re)spawn resumes; its boot prompt is the
spawn prompt with the new event, so a fresh start (the resume failed) still gets both."""
PINNED_STATUSES = frozenset({"terminated", "exited"})
"""A respawn of a session in one of these goes to the runner it ran on (its checkout and
conversation are there) while that runner is live."""
ENDED_STATUSES = frozenset({"terminated", "cleaned"})
"""Sessions in these may be pruned from a full work item (a lost one may still be resumed)."""


class PausedEvents(StrEnum):
    """``routing.pausedEvents``: what becomes of an event routed while its work item is paused."""

    HOLD = "hold"
    """Kept as a held dispatch, delivered in order after ``the-loop resume``."""
    DROP = "drop"
    """Dropped; its comment is answered that it will not reach the session."""


MAX_HELD_EVENTS = 50
"""Held dispatches a paused work item keeps; an event past them is dropped and answered so."""
HELD_DROPPED = "held while the work item was paused, then dropped by a stop, cleanup or close"


@dataclass(frozen=True)
class RoutingPolicy:
    """The operator's routing configuration, resolved into core values."""

    users: AuthorizedUsers
    bot_logins: frozenset[str]
    keywords: Keywords
    auto_execute_label: str
    require_start: bool
    session_per_pr: SessionPerPr
    interaction: ModeResolution
    harness: str
    runner_kind: str
    phases: tuple[Phase, ...]
    harness_labels: tuple[tuple[str, str], ...] = ()
    """``routing.harnessLabels`` in the operator's order: (label, harness) pairs."""
    close_ends_session: CloseEndsSession = CloseEndsSession.AUTHORIZED
    pr_session_wait: timedelta = timedelta(minutes=5)
    """How long a pull request's own session may wait for a runner before its events go to
    the work item's session instead."""
    fork_sessions: ForkSessions = ForkSessions.APPROVAL
    """Whether a fork's pull request may get a session of its own once its head is approved."""
    paused_events: PausedEvents = PausedEvents.HOLD
    """What becomes of an event for a paused work item: held until resumed, or dropped."""
    answer_strangers: bool = False
    """Whether a comment by someone not in ``authorizedUsers`` gets a marked answer."""


@dataclass(frozen=True)
class Templates:
    """Template texts for one decision, and the random boundary of its UNTRUSTED block."""

    event_prompt: str
    spawn_prompt: str
    checklist_comment: str
    confirmation_comment: str
    boundary: str
    sandboxed_event: bool = False
    sandboxed_spawn: bool = False


def dispatch_id(delivery_id: str, endpoint: str, kind: str) -> str:
    """Return the deterministic id of the ``kind`` dispatch a delivery makes for an endpoint."""
    digest = hashlib.sha256(f"{delivery_id}|{endpoint}|{kind}".encode()).hexdigest()
    return "dp-" + digest[:32]


def session_uuid(seed: str, endpoint: str, seq: int) -> str:
    """Return the harness session id of a session spawned for ``endpoint`` at ``seq``.

    ``seed`` is random per delivery (see ``Situation.session_seed``): without it two stores, or
    one store after a reset, would hand the same issue the same id, and Claude refuses an id
    it has seen ("Session ID ... is already in use").
    """
    return str(uuid.uuid5(_SESSION_NAMESPACE, f"{seed}|{endpoint}|{seq}"))


def prune_sessions(sessions: dict[str, SessionRecord], *, keep: int) -> dict[str, SessionRecord]:
    """Return ``sessions`` with the oldest ended ones dropped until at most ``keep`` remain.

    Only terminated or cleaned sessions go, oldest spawn first (never spawned counts as
    oldest); live, pending and lost ones stay even past ``keep``, since each still has a
    harness or a conversation to resume. Order of the rest is kept.
    """
    excess = len(sessions) - keep
    if excess <= 0:
        return sessions
    ended = sorted(
        (s for s in sessions.values() if s.status in ENDED_STATUSES),
        key=lambda s: (s.spawned_at is not None, s.spawned_at or datetime.min),
    )
    dropped = {s.endpoint for s in ended[:excess]}
    return {endpoint: s for endpoint, s in sessions.items() if endpoint not in dropped}


SELECTION_PENDING = (
    "## Process selection: pending\n\n"
    "The people on GitHub have not chosen the phases yet (looprelay's checklist comment on the "
    "work item). Until the frozen selection arrives in this session as a message of its own, "
    "read the work item and the code, plan, and ask what is unclear; do not change files, "
    "commit or open pull requests yet.\n"
)
"""Constant: what a session does while the phase selection is open."""


SELECTION_FROZEN_NOW = (
    "## Process selection: frozen by this event\n\n"
    "This is the message the pending selection waited for: the people on GitHub chose the "
    "phases. From now on, work through the phases below, in order.\n\n"
)
"""Constant: what heads the selection in the one event that froze it."""


def graph_context(
    graph: GraphRecord | None, *, selecting: bool = False, frozen_now: bool = False
) -> str:
    """Describe a frozen selection for the prompt, built from the operator's tokens only
    (headed as the freeze itself in the event that ``frozen_now`` made it), or, while
    ``selecting`` (phases to choose and none frozen), say it is pending."""
    if graph is None:
        return SELECTION_PENDING if selecting else ""
    selected = ", ".join(graph.phases_selected) or "none"
    skipped = ", ".join(graph.phases_skipped) or "none"
    return (
        (SELECTION_FROZEN_NOW if frozen_now else "") + "## Frozen process selection\n\n"
        f"Phases to run, in order: {selected}.\nSkipped by the operator: {skipped}.\n"
        f"Work surface: {graph.surface}. Pull requests get their own session: "
        f"{graph.session_per_pr}.\n"
    )


@dataclass
class Plan:
    """The mutable draft of one decision's writes for one work item."""

    item: WorkItemRecord
    envelope: Envelope
    policy: RoutingPolicy
    templates: Templates
    now: datetime
    session_seed: str
    held: tuple[DispatchRecord, ...] = ()
    """The work item's held dispatches (it is paused), oldest first: a resume offers them, a
    stop or cleanup drops them."""
    holding: bool = False
    """The work item is paused: the dispatches this decision routes are held."""
    froze: bool = False
    """This decision froze the phase selection: its event's prompt says so."""
    dispatches: list[DispatchRecord] = field(default_factory=list)

    def send(
        self,
        *,
        endpoint: str,
        spawn_fresh: bool = False,
        repository: str = "",
        head: PullRequestHead | None = None,
        notice: str = "",
    ) -> DispatchRecord:
        """Queue the event for ``endpoint``: a delivery into its live session, or a spawn (a
        resume when a session existed and ended) carrying the event as its first prompt.

        ``head`` is a pull request session's tree (kept with the session); ``notice`` is one
        of the constant trust notices, put in the prompt above the UNTRUSTED block."""
        session = self.item.sessions.get(endpoint)
        if session is not None and session.status in LIVE_STATUSES and not spawn_fresh:
            if head is not None and session.head != head:  # a trusted head moved, or none known
                session = session.model_copy(update={"head": head})
                self._set_session(session)
            if session.awaiting_input_at is not None and self.envelope.comment is not None:
                # A person's comment reaching it answers the question it asked.
                self._set_session(session.model_copy(update={"awaiting_input_at": None}))
            prompt = self._prompt(session, spawn=False, notice=notice)
            # Should the runner find the harness gone and its conversation lost, a fresh one
            # starts from the spawn prompt with this event, as a spawn would.
            boot = self._prompt(session, spawn=True, notice=notice)
            return self._add("deliver", session, prompt, boot_prompt=boot)
        seq = self.item.next_seq
        resumed = session if session and session.status in RESUMABLE_STATUSES else None
        fresh = SessionRecord(
            endpoint=endpoint,
            session_name=tmux_session_name(endpoint),
            session_id=resumed.session_id
            if resumed
            else session_uuid(self.session_seed, endpoint, seq),
            # A conversation belongs to its harness: a resume keeps it.
            harness=resumed.harness if resumed else self._new_session_harness(),
            runner_kind=resumed.runner_kind if resumed else self.policy.runner_kind,
            interaction=self.policy.interaction.mode,
            repository=repository or (session.repository if session else ""),
            runner_id=session.runner_id if session and session.status in PINNED_STATUSES else None,
            queued_at=self.now,
            head=head or (session.head if session else None),
        )
        self._set_session(fresh)
        prompt = self._prompt(fresh, spawn=True, notice=notice)
        return self._add("spawn", fresh, prompt, resume=resumed is not None)

    def _new_session_harness(self) -> str:
        """The harness of a session spawned now: the first of ``harness_labels`` whose label
        the event's issue or pull request carries, else the configured one."""
        labels = set(envelope_labels(self.envelope))
        return next(
            (harness for label, harness in self.policy.harness_labels if label in labels),
            self.policy.harness,
        )

    def control(
        self, kind: str, *, statuses: frozenset[str], becomes: str, closing: bool = False
    ) -> None:
        """Send a ``kind`` control dispatch to every session in ``statuses``, which then
        take the status ``becomes``; ``closing`` says the work item closed."""
        if kind == "resume":
            self._settle_held("pending")  # before the resume: they are older, lower seq
        elif kind in ("terminate", "cleanup"):
            self._settle_held("failed")
        for session in list(self.item.sessions.values()):
            if session.status in statuses:
                self._add(kind, session, "", closing=closing)
                self._set_session(session.model_copy(update={"status": becomes}))

    def _settle_held(self, status: str, *, endpoint: str | None = None) -> None:
        """Offer the held dispatches (``pending``, in their ``seq`` order) or drop them
        (``failed``, result ``dropped``): all, or those of ``endpoint``."""
        settled = [h for h in self.held if endpoint in (None, h.endpoint)]
        for held in settled:
            change: dict[str, object] = {"status": status, "updated_at": self.now}
            if status == "failed":
                change |= {"result": "dropped", "detail": HELD_DROPPED}
            self.dispatches.append(held.model_copy(update=change))
        self.held = tuple(h for h in self.held if h not in settled)

    def end_session(self, endpoint: str) -> None:
        """Terminate the live session of one endpoint, if there is one."""
        if not self.holding:  # held, the terminate follows what was held for it, in order
            self._settle_held("failed", endpoint=endpoint)
        session = self.item.sessions.get(endpoint)
        if session is not None and session.status in LIVE_STATUSES:
            self._add("terminate", session, "")
            self._set_session(session.model_copy(update={"status": "terminated"}))

    def _set_session(self, session: SessionRecord) -> None:
        sessions = dict(self.item.sessions) | {session.endpoint: session}
        kept = prune_sessions(sessions, keep=MAX_SESSIONS)
        self.item = self.item.model_copy(update={"sessions": kept})

    def _add(
        self,
        kind: str,
        session: SessionRecord,
        prompt: str,
        *,
        boot_prompt: str = "",
        resume: bool = False,
        closing: bool = False,
    ) -> DispatchRecord:
        comment = self.envelope.comment
        record = DispatchRecord(
            dispatch_id=dispatch_id(self.envelope.delivery_id, session.endpoint, kind),
            delivery_id=self.envelope.delivery_id,
            work_item=self.item.ref,
            endpoint=session.endpoint,
            seq=self.item.next_seq,
            kind=kind,
            repository=session.repository or self.item.repository,
            session_name=session.session_name,
            session_id=session.session_id,
            harness=session.harness,
            runner_kind=session.runner_kind,
            interaction=session.interaction,
            prompt=prompt,
            boot_prompt=boot_prompt,
            resume=resume,
            closing=closing,
            head=session.head,
            runner_id=session.runner_id,
            status=DISPATCH_HELD if self.holding else "pending",
            created_at=self.now,
            installation_id=self.envelope.installation_id,
            comment_id=comment.id
            if comment and self.envelope.event != "pull_request_review"
            else None,
            comment_kind="review"
            if self.envelope.event == "pull_request_review_comment"
            else "issue",
        )
        self.item = self.item.model_copy(update={"next_seq": self.item.next_seq + 1})
        self.dispatches.append(record)
        return record

    def _prompt(self, session: SessionRecord, *, spawn: bool, notice: str) -> str:
        envelope = self.envelope
        context = PromptContext(
            work_item=self.item.ref,
            endpoint=session.endpoint,
            event=envelope.event,
            action=envelope.action or "",
            repository=session.repository or self.item.repository,
            delivery_id=envelope.delivery_id,
            interaction_directive=self.policy.interaction.directive,
            graph_context=graph_context(
                self.item.graph, selecting=bool(self.policy.phases), frozen_now=self.froze
            ),
            payload_excerpt=wrap_untrusted(
                render_excerpt(envelope), boundary=self.templates.boundary
            ),
            trust_notice=notice,
        )
        source = self.templates.spawn_prompt if spawn else self.templates.event_prompt
        sandboxed = self.templates.sandboxed_spawn if spawn else self.templates.sandboxed_event
        return render_prompt(source, context, sandboxed=sandboxed)
