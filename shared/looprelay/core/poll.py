"""The poll ingress's pure part: GitHub's REST listing items in, the webhook payloads GitHub
would have sent for them out, and where each listing's cursor stands.

Each item becomes the payload of the webhook delivery it stands for (``issue_comment.created``,
``pull_request_review.submitted``, ``issues.labeled``...), which ``core.envelope`` projects as
it projects a webhook's: the worker cannot tell the two front doors apart. Each gets a stable
synthetic delivery id (``poll-comment-<id>``...), so the ledger settles an item listed twice
once. A webhook delivery of the same event has another id (GitHub's GUID); the router tells the
two apart by the event's identity (``core.sameevent``).

Which items count: an issue or pull request opened, a comment or review created, and an issue
event (labeled, unlabeled, closed, reopened: the repository's issue events listing, which names
the actor the policy judges) that happened, at or after the listing's cursor minus the overlap.
An edit of an older comment is not a new comment, as the webhook's ``edited`` action is not one
either.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel, ConfigDict

from looprelay.core.envelope import parse_moment

ISSUES = "issues"
"""``GET /repos/{o}/{r}/issues?since=&state=all``: the issues and pull requests that changed
(those opened since are ``opened`` deliveries); the pull requests' reviews are read from it."""
ISSUE_EVENTS = "issue-events"
"""``GET /repos/{o}/{r}/issues/events``: labels added and removed, closes and reopens."""
ISSUE_COMMENTS = "issue-comments"
"""``GET /repos/{o}/{r}/issues/comments?since=``."""
REVIEW_COMMENTS = "review-comments"
"""``GET /repos/{o}/{r}/pulls/comments?since=``."""
LISTINGS = (ISSUES, ISSUE_EVENTS, ISSUE_COMMENTS, REVIEW_COMMENTS)
"""Every listing a repository has a cursor of, in the order a poll reads them."""
ROUTED_ISSUE_EVENTS = frozenset({"labeled", "unlabeled", "closed", "reopened"})
"""Issue events that are webhook actions of ``issues`` or ``pull_request``."""
PENDING_REVIEW = "pending"
"""A review not submitted yet: no webhook is sent for it."""


class PollCursor(BaseModel):
    """Where one listing of one repository stands: what was routed, and how its last polls
    went."""

    model_config = ConfigDict(frozen=True)

    repository: str
    """``owner/repo``, lower-case."""
    listing: str
    began: datetime
    """When polling of this listing began, to the second: nothing before it is routed."""
    since: datetime
    """The newest moment routed from this listing (at first sight: when polling began)."""
    etag: str = ""
    etag_url: str = ""
    """The first page's ``ETag`` and the URL it belongs to: asked again unchanged, GitHub
    answers 304, which costs no rate limit."""
    polled_at: datetime | None = None
    """The last poll that read the listing to its end."""
    failed_at: datetime | None = None
    error: str = ""
    """The last poll's failure; empty once one succeeds."""
    retry_at: datetime | None = None
    """GitHub asked not to be called before then (``Retry-After``, a spent rate limit)."""


def new_cursor(repository: str, listing: str, *, now: datetime) -> PollCursor:
    """A listing seen for the first time: nothing before ``now`` (to the second, as GitHub's
    times) is routed: a repository's history is no backlog to replay."""
    began = now.replace(microsecond=0)
    return PollCursor(repository=repository.lower(), listing=listing, began=began, since=began)


def listing_since(cursor: PollCursor, *, overlap: timedelta) -> datetime:
    """The ``since`` a poll asks for: the cursor minus the overlap, so an item GitHub lists
    late (its search index trails its writes) is still seen; never before polling began."""
    return max(cursor.since - overlap, cursor.began)


def advanced(cursor: PollCursor, moment: datetime | None) -> PollCursor:
    """The cursor once what happened at ``moment`` is routed; it never moves back."""
    if moment is None or moment <= cursor.since:
        return cursor
    return cursor.model_copy(update={"since": moment})


@dataclass(frozen=True)
class PollTarget:
    """The repository polled, as GitHub's ``GET /repos/{o}/{r}`` names it, and the App
    installation serving it (None: token auth): every payload carries both, as a webhook's."""

    repository: Mapping[str, Any]
    installation_id: int | None = None


@dataclass(frozen=True)
class PolledDelivery:
    """A webhook delivery made from a listing item: what ingress projects and queues."""

    event: str
    delivery_id: str
    payload: dict[str, Any]
    happened_at: datetime
    """When the item was made on GitHub: its order key, and how far the cursor moves."""


def comment_delivery(
    item: Mapping[str, Any],
    *,
    issue: Mapping[str, Any],
    target: PollTarget,
    since: datetime,
) -> PolledDelivery | None:
    """``issue_comment.created`` for an item of the issue comments listing on ``issue``;
    None when it was created before ``since`` (an edit) or is malformed."""
    return _created(
        "issue_comment",
        f"poll-comment-{item.get('id')}",
        item,
        {"comment": dict(item), "issue": dict(issue)},
        target=target,
        since=since,
    )


def review_comment_delivery(
    item: Mapping[str, Any],
    *,
    pull_request: Mapping[str, Any],
    target: PollTarget,
    since: datetime,
) -> PolledDelivery | None:
    """``pull_request_review_comment.created`` for an item of the review comments listing."""
    return _created(
        "pull_request_review_comment",
        f"poll-review-comment-{item.get('id')}",
        item,
        {"comment": dict(item), "pull_request": dict(pull_request)},
        target=target,
        since=since,
    )


def review_delivery(
    review: Mapping[str, Any],
    *,
    pull_request: Mapping[str, Any],
    target: PollTarget,
    since: datetime,
) -> PolledDelivery | None:
    """``pull_request_review.submitted`` for a submitted review (the REST ``state`` is upper
    case, the webhook's lower case); None for a pending one or one submitted before ``since``."""
    state = review.get("state")
    if not isinstance(state, str) or state.lower() == PENDING_REVIEW:
        return None
    submitted = {**review, "state": state.lower()}
    return _created(
        "pull_request_review",
        f"poll-review-{review.get('id')}",
        submitted,
        {"review": submitted, "pull_request": dict(pull_request)},
        target=target,
        since=since,
        moment_key="submitted_at",
        action="submitted",
    )


def issue_event_delivery(
    item: Mapping[str, Any],
    *,
    pull_request: Mapping[str, Any] | None,
    target: PollTarget,
    since: datetime,
) -> PolledDelivery | None:
    """``issues.<action>`` (or ``pull_request.<action>`` with ``pull_request``, the full pull
    request the event's issue is) for an item of the issue events listing: labeled,
    unlabeled, closed, reopened. None for another event, one before ``since``, or a malformed
    one."""
    action, issue = item.get("event"), item.get("issue")
    happened = parse_moment(item.get("created_at"))
    if action not in ROUTED_ISSUE_EVENTS or not isinstance(issue, Mapping) or happened is None:
        return None
    if happened < since or not _is_id(item.get("id")):
        return None
    payload: dict[str, Any] = {"action": action, "sender": item.get("actor")}
    if isinstance(item.get("label"), Mapping):
        payload["label"] = dict(item["label"])
    event = _as_of(payload, issue, pull_request, item["created_at"])
    return PolledDelivery(event, f"poll-event-{item['id']}", _stamped(payload, target), happened)


def opened_delivery(
    issue: Mapping[str, Any],
    *,
    pull_request: Mapping[str, Any] | None,
    target: PollTarget,
    since: datetime,
) -> PolledDelivery | None:
    """``issues.opened`` for an item of the issues listing created at or after ``since`` (or
    ``pull_request.opened`` with ``pull_request``, the full pull request it is); None for an
    older or malformed one."""
    created = parse_moment(issue.get("created_at"))
    if created is None or created < since or not _is_id(issue.get("id")):
        return None
    payload: dict[str, Any] = {"action": "opened", "sender": issue.get("user")}
    event = _as_of(payload, issue, pull_request, issue["created_at"])
    return PolledDelivery(event, f"poll-opened-{issue['id']}", _stamped(payload, target), created)


def issue_number(item: Mapping[str, Any], url_key: str) -> int | None:
    """The issue or pull request number a listing item names by URL (``issue_url``,
    ``pull_request_url``: ``.../issues/7``); None when it names none."""
    url = item.get(url_key)
    tail = url.rstrip("/").rsplit("/", 1)[-1] if isinstance(url, str) else ""
    return int(tail) if tail.isascii() and tail.isdigit() else None


def is_pull_request(issue: Mapping[str, Any]) -> bool:
    """Whether an issue listing item is a pull request (it carries a ``pull_request`` key)."""
    return isinstance(issue.get("pull_request"), Mapping)


def _created(
    event: str,
    delivery_id: str,
    item: Mapping[str, Any],
    parts: dict[str, Any],
    *,
    target: PollTarget,
    since: datetime,
    moment_key: str = "created_at",
    action: str = "created",
) -> PolledDelivery | None:
    created = parse_moment(item.get(moment_key))
    if created is None or created < since or not _is_id(item.get("id")):
        return None
    payload = {"action": action, **parts, "sender": item.get("user")}
    return PolledDelivery(event, delivery_id, _stamped(payload, target), created)


def _as_of(
    payload: dict[str, Any],
    issue: Mapping[str, Any],
    pull_request: Mapping[str, Any] | None,
    moment: str,
) -> str:
    """Put the issue (or the pull request it is) in ``payload`` as of the change at
    ``moment``, as the webhook's payload has it: its ``updated_at`` is the change's (by which
    ``core.sameevent`` matches the two front doors' deliveries); return the event."""
    if pull_request is None:
        payload["issue"] = {**issue, "updated_at": moment}
        return "issues"
    payload["pull_request"] = {**pull_request, "updated_at": moment}
    payload["number"] = pull_request.get("number")
    return "pull_request"


def _stamped(payload: dict[str, Any], target: PollTarget) -> dict[str, Any]:
    payload["repository"] = dict(target.repository)
    if target.installation_id is not None:
        payload["installation"] = {"id": target.installation_id}
    return payload


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


class PollRow(BaseModel):
    """How far behind the poller is on one repository, for ``status``."""

    model_config = ConfigDict(frozen=True)

    repository: str
    polled_at: datetime | None
    """The oldest of its listings' last complete polls: everything before is routed."""
    behind_seconds: int | None
    """Seconds since then; None before a first complete poll."""
    error: str = ""
    failed_at: datetime | None = None
    retry_at: datetime | None = None
    """Backing off until then (GitHub's rate limit, or a refusal)."""


def poll_rows(cursors: Sequence[PollCursor], *, now: datetime) -> list[PollRow]:
    """One row per repository of ``cursors``, by name. Never raises."""
    by_repository: dict[str, list[PollCursor]] = {}
    for cursor in cursors:
        by_repository.setdefault(cursor.repository, []).append(cursor)
    rows = []
    for repository, listed in sorted(by_repository.items()):
        polled = [c.polled_at for c in listed]
        oldest = None if None in polled else min(p for p in polled if p is not None)
        failed = max(listed, key=lambda c: c.failed_at or datetime.min.replace(tzinfo=UTC))
        retry = [c.retry_at for c in listed if c.retry_at is not None and c.retry_at > now]
        rows.append(
            PollRow(
                repository=repository,
                polled_at=oldest,
                behind_seconds=None
                if oldest is None
                else max(int((now - oldest).total_seconds()), 0),
                error=failed.error if failed.failed_at and failed.error else "",
                failed_at=failed.failed_at if failed.error else None,
                retry_at=max(retry, default=None),
            )
        )
    return rows
