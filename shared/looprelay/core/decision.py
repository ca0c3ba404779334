"""The values a decision is made of: what the worker loaded, and what it must write and say."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime

from looprelay.core.envelope import Envelope
from looprelay.core.model import DispatchRecord, WorkItemRecord
from looprelay.core.workitems import WorkItemRef, WorkItems


@dataclass(frozen=True)
class Situation:
    """What the worker loaded for one delivery before deciding."""

    envelope: Envelope
    names: WorkItems
    target: WorkItemRef | None
    work_item: WorkItemRecord | None
    now: datetime
    session_seed: str
    """Random text the caller draws once per delivery; a fresh session's id derives from it, so
    ids never repeat across store resets or deployments sharing a runner machine."""
    recorded_checklist_body: str | None = None
    pr_checkout_available: bool = False
    pinned_ids: Mapping[str, int] = field(default_factory=dict)
    """The stored first-sight pin of the actor's login (lower case -> user id), when the
    login is listed alone in ``routing.authorizedUsers``."""
    held: tuple[DispatchRecord, ...] = ()
    """The work item's held dispatches, oldest first (loaded only while it is paused)."""


@dataclass(frozen=True)
class CommentPost:
    """A comment looprelay posts on the work item (the caller adds the marker)."""

    kind: str
    body: str


@dataclass(frozen=True)
class Note:
    """One structured event for the log."""

    name: str
    data: Mapping[str, object] = field(default_factory=dict)


@dataclass(frozen=True)
class Decision:
    """Everything one delivery changes: ledger outcome, state, dispatches, comments, notes."""

    outcome: str
    detail: str = ""
    work_item: WorkItemRecord | None = None
    dispatches: tuple[DispatchRecord, ...] = ()
    comments: tuple[CommentPost, ...] = ()
    notes: tuple[Note, ...] = ()
