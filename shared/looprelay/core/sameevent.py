"""Which deliveries are one GitHub event come through two front doors: the webhook (GitHub's
``X-GitHub-Delivery`` GUID) and the poller (``poll-comment-<id>``...). The ledger cannot tell:
their delivery ids differ. So each delivery a work item applies is remembered with its event's
identity (``AppliedDelivery.event_key``/``event_at``), and a later delivery of the same identity
is not applied again (``ignored:same-event``).

The identity:

- a new comment, review comment or review: its kind and GitHub id (``issue-comment:123``);
- a label added or removed: the issue or pull request's number, the label, the action, and the
  moment of the change (the issue's or pull request's ``updated_at`` in the webhook payload; the
  issue event's ``created_at`` in a poll), equal within ``SAME_MOMENT``, as GitHub's times have
  whole seconds;
- an open, close or reopen: the number, the action and the moment, the same way. The number
  matters: one work item's issue and its pull requests can change state in the same second.

Anything else has none and is never taken for another delivery. A work item remembers its last
``MAX_APPLIED`` deliveries: a webhook delivery and the poll of it arrive within a poll interval
of each other, far inside that.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from looprelay.core.envelope import CREATING_ACTIONS, Envelope
from looprelay.core.model import AppliedDelivery
from looprelay.core.policy import COMMENT_EVENTS, LIFECYCLE_EVENTS

SAME_EVENT = "ignored:same-event"
"""The outcome of a delivery whose event a work item already applied under another id."""
SAME_MOMENT = timedelta(seconds=1)
_LABEL_ACTIONS = frozenset({"labeled", "unlabeled"})
_STATE_ACTIONS = frozenset({"opened", "closed", "reopened"})
_COMMENT_KINDS = {
    "issue_comment": "issue-comment",
    "pull_request_review_comment": "review-comment",
    "pull_request_review": "review",
}


@dataclass(frozen=True)
class EventIdentity:
    """What makes two deliveries one event: a key, and for a change of state its moment."""

    key: str
    at: datetime | None = None


def event_identity(envelope: Envelope) -> EventIdentity | None:
    """Return the identity of the event ``envelope`` carries, or None when it has none that
    two front doors could share. Never raises."""
    action = envelope.action or ""
    if envelope.event in COMMENT_EVENTS:
        new = action in CREATING_ACTIONS and envelope.comment is not None
        comment_id = envelope.comment.id if envelope.comment else 0
        return EventIdentity(f"{_COMMENT_KINDS[envelope.event]}:{comment_id}") if new else None
    changed = _changed(envelope) if envelope.event in LIFECYCLE_EVENTS else None
    if changed is None:
        return None
    number, at = changed
    if action in _LABEL_ACTIONS and envelope.label:
        return EventIdentity(f"#{number}:{action}:{envelope.label}", at)
    return EventIdentity(f"#{number}:{action}", at) if action in _STATE_ACTIONS else None


def applied_before(
    identity: EventIdentity | None, applied: Sequence[AppliedDelivery]
) -> AppliedDelivery | None:
    """Return the delivery in ``applied`` that carried the same event, or None."""
    if identity is None:
        return None
    for entry in reversed(applied):
        if entry.event_key == identity.key and _same_moment(identity.at, entry.event_at):
            return entry
    return None


def _same_moment(one: datetime | None, other: datetime | None) -> bool:
    if one is None or other is None:
        return one is other  # both None: an event its id names
    return abs(one - other) <= SAME_MOMENT


def _changed(envelope: Envelope) -> tuple[int, datetime] | None:
    """The number of the issue or pull request that changed, and when; None without a time.
    Issues and pull requests share one numbering, so the webhook's ``pull_request`` and the
    poll's issue event name one pull request alike."""
    subject = envelope.pull_request if envelope.pull_request is not None else envelope.issue
    if subject is None or subject.updated_at is None:
        return None
    return subject.number, subject.updated_at
