"""Documents the store keeps: the delivery ledger and the event log.

These are pydantic models because they cross an edge (SQLite rows, Firestore documents, the
``--json`` output of listing commands).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

RECEIVED = "received"
"""Ledger outcome of a delivery the worker has taken but not yet settled."""

SETTLED_OUTCOMES = ("dispatched", "ignored", "failed", "pong")
"""Settled outcomes besides ``refused:<reason>`` and ``ignored:<reason>`` (``pong``: GitHub's
ping)."""
REASONED_OUTCOMES = ("refused", "ignored")
"""Outcomes that also come as ``<outcome>:<reason>``; a filter by the bare word matches all."""
IGNORED_EVENT = "ignored:event"
"""The outcome of a delivery whose event is not on ``webhook.events``: recorded, never routed,
so every delivery GitHub lists under "Recent Deliveries" can be found in the ledger."""
PONG = "pong"

MAX_DETAIL_CHARS = 2_000
"""Cap on the free-text ``detail`` of a ledger record, so no document can grow without bound."""


def is_valid_outcome(outcome: str) -> bool:
    """Tell whether ``outcome`` is one the ledger may hold."""
    if outcome == RECEIVED or outcome in SETTLED_OUTCOMES:
        return True
    prefix, _, reason = outcome.partition(":")
    return prefix in REASONED_OUTCOMES and bool(reason)


class DeliveryRecord(BaseModel):
    """One GitHub delivery as the worker saw it; keyed by ``X-GitHub-Delivery``."""

    model_config = ConfigDict(frozen=True)

    delivery_id: str
    event: str
    action: str | None = None
    outcome: str = RECEIVED
    detail: str = Field(default="", max_length=MAX_DETAIL_CHARS)
    attempts: int = 1
    received_at: datetime
    settled_at: datetime | None = None
    envelope: str = ""
    """The slim envelope as JSON, kept so a dead letter can be replayed."""
    order_group: str = ""
    """The issue or pull request it is ordered within (``core.order``); empty: none."""
    order_key: str = ""
    """Its place in that group's order (``Envelope.order_key``)."""

    @property
    def settled(self) -> bool:
        """Whether the delivery has reached its one final outcome."""
        return self.outcome != RECEIVED


class EventRecord(BaseModel):
    """One structured event of the log that ``looprelay events`` lists."""

    model_config = ConfigDict(frozen=True)

    name: str
    at: datetime
    delivery_id: str | None = None
    work_item: str | None = None
    severity: str = "INFO"
    data: dict[str, Any] = Field(default_factory=dict)
    cursor: str = Field(default="", exclude=True)
    """Where the event sits in its store's log, set when read: pass it as ``after`` to list
    what came later. Opaque; each store orders by its own (SQLite: insertion order)."""


class RegistrationToken(BaseModel):
    """A single-use token an operator mints to let one runner register; stored hashed."""

    model_config = ConfigDict(frozen=True)

    token_hash: str
    created_at: datetime
    expires_at: datetime
    used_at: datetime | None = None


MAX_RUNNER_LABELS = 32


class RunnerRecord(BaseModel):
    """A registered runner agent. Only the hash of its secret is ever stored."""

    model_config = ConfigDict(frozen=True)

    runner_id: str
    name: str
    labels: dict[str, str] = Field(default_factory=dict, max_length=MAX_RUNNER_LABELS)
    secret_hash: str
    registered_at: datetime
    last_seen_at: datetime | None = None
    revoked_at: datetime | None = None
    version: str = ""
    capacity: int = 1
    repositories: list[str] = Field(default_factory=list, max_length=200)
    """Repositories it has a checkout for (``owner/repo``)."""
    workspace: bool = False
    """Whether it can create a checkout per session (so any repository, and PR sessions)."""
    sessions: int = 0
    """Sessions it holds now, from its last heartbeat."""
    agent_id: str = ""
    """The agent process serving it, as its heartbeats name it (one at a time per runner)."""
    hostname: str = ""
    """The machine its agent runs on, as its heartbeats name it."""
    harnesses: list[str] = Field(default_factory=list, max_length=20)
    """The coding-agent CLIs its agent can run, as its heartbeats name them; empty: not said
    (an agent older than the field), and then any."""

    @property
    def revoked(self) -> bool:
        """Whether an operator revoked this runner."""
        return self.revoked_at is not None


MAX_LINKED_PULL_REQUESTS = 50
MAX_SESSIONS = 20
"""Sessions a work item keeps: past it, saving prunes the oldest ended ones (core.plan). Not
checked on reading, so an item saved past it by an older version stays readable."""
MAX_COMMANDS = 20
MAX_PROMPT_CHARS = 60_000
"""A rendered prompt is bounded so a dispatch document stays far below Firestore's 1 MiB."""


class PullRequestHead(BaseModel):
    """Where a pull request's own session gets its tree, and whether that tree is trusted.

    ``fork`` is true when the head lives in another repository than the base (decided from
    the payload's repository ids): the tree is untrusted, checked out at ``sha`` (the head an
    authorized person approved) with every agent-config path restored from ``base_ref``.
    A same-repository head (``fork`` false) is the base repository's own content.
    """

    model_config = ConfigDict(frozen=True)

    fork: bool
    sha: str = ""
    base_ref: str = ""


class SessionRecord(BaseModel):
    """An agent session of a work item: its own, or one a pull request was given."""

    model_config = ConfigDict(frozen=True)

    endpoint: str
    session_name: str
    session_id: str
    harness: str
    runner_kind: str
    interaction: str
    repository: str = ""
    """The repository the session's checkout is of; empty means the work item's."""
    status: str = "pending"
    """``pending`` (spawn queued), ``live``, ``exited`` (its runner reports its harness
    ended), ``lost``, ``terminated`` or ``cleaned``."""
    exit_status: int | None = None
    """An ``exited`` session's harness exit status, when its runner knew it."""
    exited_at: datetime | None = None
    """When an ``exited`` session's harness ended (or its runner first reported it gone)."""
    runner_id: str | None = None
    tmux_socket: str | None = None
    """The tmux socket the runner reported at spawn (None: the runner's default one)."""
    spawned_at: datetime | None = None
    queued_at: datetime | None = None
    """When its (re)spawn was queued; how long a ``pending`` session has waited for a runner."""
    announced: bool = False
    head: PullRequestHead | None = None
    """A pull request's own session: the tree it was given (for a fork, the approved sha);
    a fork session whose approved sha moves is respawned at the new one."""
    token_hash: str = ""
    """The hash of the token its harness speaks with (``looprelay session``); "" for none."""
    installation_id: int | None = None
    """The GitHub App installation its comments are posted as (from the dispatch that ran it)."""
    awaiting_input_at: datetime | None = None
    """Since when it waits for a human's answer to its question; None when it does not."""
    activity: str = ""
    """What it last did that a person would notice (``pasted``, ``turn answered``, ...)."""
    active_at: datetime | None = None


class PullRequestState(BaseModel):
    """What the worker knows of one linked pull request's head, and its approval.

    ``fork`` is true unless a payload showed the head and base repository ids equal: an
    unknown head counts as a fork (fail closed). ``approved_sha`` is the head an authorized
    person approved by commenting the ``start`` keyword on the pull request; a later push
    (a new ``head_sha``) needs a new approval.
    """

    model_config = ConfigDict(frozen=True)

    fork: bool = True
    head_sha: str = ""
    base_ref: str = ""
    approved_sha: str = ""
    approved_by: str = ""
    approved_at: datetime | None = None


class GraphRecord(BaseModel):
    """The frozen phase selection of a work item; never changed once written."""

    model_config = ConfigDict(frozen=True)

    phases_selected: list[str]
    phases_skipped: list[str]
    surface: str
    session_per_pr: str
    actor: str
    at: datetime
    source: str
    notes: list[str] = Field(default_factory=list)


class CommandLog(BaseModel):
    """One recognised control command: who, when, which comment."""

    model_config = ConfigDict(frozen=True)

    command: str
    actor: str
    at: datetime
    delivery_id: str
    comment_id: int | None = None
    effect: str = ""


MAX_APPLIED = 50
"""Deliveries a work item remembers having applied: enough to cover the queue's retries of
the ones not settled yet (a crash between the work item's save and the ledger's settle)."""


class AppliedDelivery(BaseModel):
    """A delivery whose decision this work item's save carried, so a retry of it (the queue
    redelivers a task whose worker died before settling) changes nothing and reports the same
    outcome and dispatches instead of deciding again on the state it already moved."""

    model_config = ConfigDict(frozen=True)

    delivery_id: str
    outcome: str
    detail: str = Field(default="", max_length=MAX_DETAIL_CHARS)
    dispatch_ids: list[str] = Field(default_factory=list)
    event_key: str = ""
    event_at: datetime | None = None
    """The identity of the event it carried (``core.sameevent``), so the same event through
    the other front door (webhook or poll) is not applied twice; empty when it has none."""


class WorkItemRecord(BaseModel):
    """Everything the worker knows about one work item, in one document.

    ``version`` is the compare-and-set guard: every save names the version it read.
    """

    model_config = ConfigDict(frozen=True)

    ref: str
    repository: str
    number: int
    control: str = "idle"
    pull_requests: list[str] = Field(default_factory=list, max_length=MAX_LINKED_PULL_REQUESTS)
    checklist_comment_id: int | None = None
    graph: GraphRecord | None = None
    sessions: dict[str, SessionRecord] = Field(default_factory=dict)
    pull_request_heads: dict[str, PullRequestState] = Field(default_factory=dict)
    """Linked pull requests' heads and approvals, by pull request ref."""
    next_seq: int = 1
    commands: list[CommandLog] = Field(default_factory=list, max_length=MAX_COMMANDS)
    applied: list[AppliedDelivery] = Field(default_factory=list, max_length=MAX_APPLIED)
    version: int = 0
    updated_at: datetime | None = None


DISPATCH_KINDS = ("spawn", "deliver", "terminate", "pause", "resume", "cleanup")
DISPATCH_OPEN = ("pending", "leased")
"""Statuses of a dispatch that is not settled yet; it blocks later ones of its work item."""
DISPATCH_HELD = "held"
"""The status of an event's dispatch routed while its work item is paused: kept, offered to
no runner, and made ``pending`` in ``seq`` order by ``the-loop resume`` (settled ``failed``,
result ``dropped``, by a stop, cleanup or close instead)."""
DISPATCH_EXPIRED = "expired"
"""The ``result`` of a dispatch settled ``failed`` because no live runner served its
repository in time (``runners.unservedExpirySeconds``); an operator can replay it."""


class DispatchRecord(BaseModel):
    """One thing a runner must do for one session, in per-work-item order (``seq``)."""

    model_config = ConfigDict(frozen=True)

    dispatch_id: str
    delivery_id: str
    work_item: str
    endpoint: str
    seq: int
    kind: str
    repository: str
    session_name: str
    session_id: str
    harness: str = "claude"
    runner_kind: str = "tmux"
    interaction: str = "work-item"
    prompt: str = Field(default="", max_length=MAX_PROMPT_CHARS)
    boot_prompt: str = Field(default="", max_length=MAX_PROMPT_CHARS)
    """For a deliver: what a fresh harness starts with when the session's harness is gone and
    its conversation cannot be resumed (the spawn prompt with this event); "": the prompt."""
    labels: dict[str, str] = Field(default_factory=dict)
    resume: bool = False
    """For a spawn: resume the conversation ``session_id`` names (a respawn), else start it."""
    closing: bool = False
    """For a cleanup: the work item closed (a runner may keep its checkout on close)."""
    head: PullRequestHead | None = None
    """For a pull request's own session: where its tree comes from and whether it is trusted;
    None for a work item's session (always the base repository's own content)."""
    runner_id: str | None = None
    """The runner that must apply it (session affinity), or None for any eligible runner."""
    status: str = "pending"
    """``pending``, ``leased``, ``succeeded`` or ``failed``; ``held`` while its work item is
    paused."""
    lease_holder: str | None = None
    lease_expires_at: datetime | None = None
    attempts: int = 0
    result: str = ""
    detail: str = Field(default="", max_length=MAX_DETAIL_CHARS)
    """The runner's account of its last result (a failed turn's message first), for
    ``looprelay dispatches``."""
    created_at: datetime
    updated_at: datetime | None = None
    comment_id: int | None = None
    comment_kind: str | None = None
    """Where progress reactions go: ``issue`` comment or ``review`` comment."""
    installation_id: int | None = None
    """The GitHub App installation to act as when reporting progress."""

    def slim(self) -> DispatchRecord:
        """This dispatch without its texts (prompts up to 60,000 characters each, result,
        detail): what scheduling keeps of it in memory."""
        return self.model_copy(update={"prompt": "", "boot_prompt": "", "result": "", "detail": ""})


class InboxRecord(BaseModel):
    """The state of one order group's inbox (``core.order``): who holds its short lease and
    what the drain has learned. The deliveries themselves are the group's unsettled ledger
    records; this record only says who may hand them off, and how far it got."""

    model_config = ConfigDict(frozen=True)

    group: str
    holder: str = ""
    """The worker attempt draining it now; empty: nobody."""
    until: datetime | None = None
    """When the holder's lease lapses unless kept; then anyone may take it."""
    knocks: int = 0
    """Counts the takes refused while it was held: a holder releases only if none came since
    it last looked, so a delivery appended meanwhile is never left undrained."""
    drained_key: str = ""
    """The largest order key handed off: a delivery with a smaller one arrived late."""
    stuck: str = ""
    """The delivery whose handler failed at the head of the inbox, if any."""
    stuck_since: datetime | None = None
    """When ``stuck`` first failed: after ``routing.orderWaitSeconds`` the others go ahead."""
