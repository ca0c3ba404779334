"""The slim, typed event the webhook enqueues: what the worker needs and nothing else.

A GitHub payload can be 25 MB; a Cloud Task holds 1 MB. :func:`project_envelope` keeps ids,
names and a capped copy of each free-text field, and notes which fields it cut.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from looprelay.core.markers import is_marked

_Text = Callable[[Any, int, str], str]
"""Caps a free-text value and notes the field when it was cut."""

TITLE_CAP = 1_024
NAME_CAP = 256
LIST_CAP = 100
"""Labels, linked PR numbers and installation repositories kept per envelope."""
_REPLACEMENT = "\ufffd"
_LONE_SURROGATE = re.compile("[\ud800-\udfff]")
_SHA = re.compile(r"[0-9a-fA-F]{40}|[0-9a-fA-F]{64}")


class _Value(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Actor(_Value):
    """A GitHub account: the sender of an event or the author of a comment."""

    login: str
    id: int | None = None
    type: str | None = None


class Repository(_Value):
    """The repository an event happened in."""

    full_name: str
    id: int | None = None
    private: bool | None = None


class Issue(_Value):
    """The issue (or pull request, seen as an issue) an event names."""

    number: int
    title: str = ""
    state: str | None = None
    is_pull_request: bool = False
    author: Actor | None = None
    labels: list[str] = Field(default_factory=list)
    updated_at: datetime | None = None
    """When it last changed: in a label or state change's payload, the moment of that change
    (``core.sameevent`` tells a webhook delivery and a poll of one change apart by it)."""


class Comment(_Value):
    """An issue comment, a review comment or a review body."""

    id: int
    body: str = ""
    author: Actor | None = None
    review_state: str | None = None
    created_at: datetime | None = None
    """When it was made (a review's ``submitted_at``): orders a burst of new comments among
    themselves (``core.order.arrange``)."""
    marked: bool = False
    """The whole body carried the loop-prevention marker. A session ends its comments with it,
    and the cap on ``body`` can cut that end off."""
    review_id: int | None = None
    """The review it belongs to: a review comment's ``pull_request_review_id``, a review's own
    id. A review's deliveries reach its session as one turn (``core.order.turns``)."""
    path: str | None = None
    """A review comment's file."""
    line: int | None = None
    """A review comment's line in that file (its ``original_line`` once outdated)."""


class PullRequest(_Value):
    """A pull request and where its head lives."""

    number: int
    title: str = ""
    body: str = ""
    state: str | None = None
    merged: bool = False
    draft: bool = False
    head_ref: str | None = None
    head_repo: str | None = None
    head_repo_id: int | None = None
    """The head repository's id: a fork is told by ids, which a rename cannot fake. None when
    the fork was deleted (GitHub sends ``head.repo: null``)."""
    head_sha: str | None = None
    base_ref: str | None = None
    base_repo: str | None = None
    base_repo_id: int | None = None
    author: Actor | None = None
    labels: list[str] = Field(default_factory=list)
    updated_at: datetime | None = None
    """As ``Issue.updated_at``."""


class CheckRef(_Value):
    """A CI event's subject (check run or suite, workflow run, status)."""

    name: str | None = None
    conclusion: str | None = None
    head_sha: str | None = None
    head_branch: str | None = None
    pull_requests: list[int] = Field(default_factory=list)


class Envelope(_Value):
    """One delivery, projected. Every free-text field is capped; ``truncated`` names the cut
    ones."""

    delivery_id: str
    event: str
    action: str | None = None
    installation_id: int | None = None
    repository: Repository | None = None
    sender: Actor | None = None
    issue: Issue | None = None
    pull_request: PullRequest | None = None
    comment: Comment | None = None
    label: str | None = None
    check: CheckRef | None = None
    repositories_added: list[str] = Field(default_factory=list)
    repositories_removed: list[str] = Field(default_factory=list)
    truncated: list[str] = Field(default_factory=list)
    joined: list[Envelope] = Field(default_factory=list)
    """Deliveries handed off with this one as one turn (``core.order.turns``): a review's
    inline comments, or a burst of one author's comments. Set by the inbox, never by ingress;
    each is slimmed (``joined_part``)."""
    order_key: str = ""
    """Where this delivery stands in its issue's or pull request's order (``core.order``):
    the moment the webhook received it, whatever the event. Empty in a task queued before
    keys existed: such a delivery is handled in no particular order."""


CREATING_ACTIONS = frozenset({"created", "submitted"})
"""Actions that make a comment or review: only such a comment is reordered by its own time."""


def order_key(at: datetime) -> str:
    """Return the sortable text key of a delivery received ``at`` (aware), to the µs."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def project_envelope(
    *,
    event: str,
    delivery_id: str,
    payload: Mapping[str, Any],
    max_text_chars: int,
    received_at: datetime | None = None,
) -> Envelope:
    """Project a verified GitHub payload into an :class:`Envelope`.

    Expects the decoded JSON object and the aware moment the webhook received it (None: keyed
    only by a new comment's own time, if any). Fields of an unexpected type are left out
    rather than trusted; never raises for payload shape.
    """
    cut: list[str] = []

    def text(value: Any, cap: int, name: str) -> str:
        if not isinstance(value, str):
            return ""
        if len(value) > cap:
            cut.append(name)
            return _utf8(value[:cap])
        return _utf8(value)

    comment_source = _dict(payload, "comment") or _dict(payload, "review")
    return Envelope(
        delivery_id=delivery_id,
        event=event,
        action=_str(payload, "action"),
        installation_id=_int(_dict(payload, "installation"), "id"),
        repository=_repository(_dict(payload, "repository")),
        sender=_actor(_dict(payload, "sender")),
        issue=_issue(_dict(payload, "issue"), text),
        pull_request=_pull_request(_dict(payload, "pull_request"), text, max_text_chars),
        comment=_comment(comment_source, text, max_text_chars, _dict(payload, "review") != {}),
        label=text(_dict(payload, "label").get("name"), NAME_CAP, "label") or None,
        check=_check(payload),
        repositories_added=_repo_names(payload.get("repositories_added")),
        repositories_removed=_repo_names(payload.get("repositories_removed")),
        truncated=cut,
        order_key=order_key(received_at) if received_at is not None else "",
    )


def joined_part(envelope: Envelope) -> Envelope:
    """``envelope`` as a part of another delivery's turn: its comment and who sent it, without
    the issue or pull request the turn's lead already names."""
    return envelope.model_copy(update={"issue": None, "pull_request": None, "joined": []})


def parse_moment(value: Any) -> datetime | None:
    """GitHub's ISO 8601 time as an aware UTC moment; None for anything else."""
    if not isinstance(value, str):
        return None
    try:
        moment = datetime.fromisoformat(value)
        return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).astimezone(UTC)
    except (ValueError, OverflowError):  # not ISO 8601, or past the calendar's edge in UTC
        return None


def _dict(obj: Mapping[str, Any] | None, key: str) -> Mapping[str, Any]:
    value = obj.get(key) if obj else None
    return value if isinstance(value, Mapping) else {}


def _utf8(value: str) -> str:
    # JSON may escape a lone surrogate (\ud800), which json.loads accepts but no UTF-8
    # encoder does: the envelope could not be serialised for the queue (a 500 at ingress).
    # ASCII text (most of it) holds none.
    return value if value.isascii() else _LONE_SURROGATE.sub(_REPLACEMENT, value)


def _str(obj: Mapping[str, Any], key: str) -> str | None:
    value = obj.get(key)
    return _utf8(value[:NAME_CAP]) if isinstance(value, str) else None


def _int(obj: Mapping[str, Any], key: str) -> int | None:
    value = obj.get(key)
    # bool is an int in Python; a JSON true is not an id.
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _sha(obj: Mapping[str, Any]) -> str | None:
    # A commit id goes to the runner's git as an argument: only its exact shape passes.
    value = obj.get("sha")
    return value.lower() if isinstance(value, str) and _SHA.fullmatch(value) else None


def _actor(obj: Mapping[str, Any]) -> Actor | None:
    login = _str(obj, "login")
    if login is None:
        return None
    return Actor(login=login, id=_int(obj, "id"), type=_str(obj, "type"))


def _repository(obj: Mapping[str, Any]) -> Repository | None:
    full_name = _str(obj, "full_name")
    if full_name is None:
        return None
    private = obj.get("private")
    return Repository(
        full_name=full_name,
        id=_int(obj, "id"),
        private=private if isinstance(private, bool) else None,
    )


def _issue(obj: Mapping[str, Any], text: _Text) -> Issue | None:
    number = _int(obj, "number")
    if number is None:
        return None
    return Issue(
        number=number,
        title=text(obj.get("title"), TITLE_CAP, "issue.title"),
        state=_str(obj, "state"),
        is_pull_request="pull_request" in obj,
        author=_actor(_dict(obj, "user")),
        labels=_labels(obj),
        updated_at=parse_moment(obj.get("updated_at")),
    )


def _labels(obj: Mapping[str, Any]) -> list[str]:
    labels = obj.get("labels")
    return [
        _utf8(label["name"][:NAME_CAP])
        for label in (labels if isinstance(labels, list) else [])[:LIST_CAP]
        if isinstance(label, Mapping) and isinstance(label.get("name"), str)
    ]


def _pull_request(obj: Mapping[str, Any], text: _Text, cap: int) -> PullRequest | None:
    number = _int(obj, "number")
    if number is None:
        return None
    head, base = _dict(obj, "head"), _dict(obj, "base")
    return PullRequest(
        number=number,
        title=text(obj.get("title"), TITLE_CAP, "pull_request.title"),
        body=text(obj.get("body"), cap, "pull_request.body"),
        state=_str(obj, "state"),
        merged=obj.get("merged") is True,
        draft=obj.get("draft") is True,
        head_ref=_str(head, "ref"),
        head_repo=_str(_dict(head, "repo"), "full_name"),
        head_repo_id=_int(_dict(head, "repo"), "id"),
        head_sha=_sha(head),
        base_ref=_str(base, "ref"),
        base_repo=_str(_dict(base, "repo"), "full_name"),
        base_repo_id=_int(_dict(base, "repo"), "id"),
        author=_actor(_dict(obj, "user")),
        labels=_labels(obj),
        updated_at=parse_moment(obj.get("updated_at")),
    )


def _comment(obj: Mapping[str, Any], text: _Text, cap: int, is_review: bool) -> Comment | None:
    comment_id = _int(obj, "id")
    if comment_id is None:
        return None
    body = obj.get("body")
    return Comment(
        id=comment_id,
        body=text(body, cap, "comment.body"),
        marked=isinstance(body, str) and is_marked(body),
        author=_actor(_dict(obj, "user")),
        review_state=_str(obj, "state") if is_review else None,
        created_at=parse_moment(obj.get("created_at") or obj.get("submitted_at")),
        review_id=comment_id if is_review else _int(obj, "pull_request_review_id"),
        path=_str(obj, "path"),
        line=_int(obj, "line") or _int(obj, "original_line"),
    )


def _check(payload: Mapping[str, Any]) -> CheckRef | None:
    for key in ("check_run", "check_suite", "workflow_run"):
        obj = _dict(payload, key)
        if obj:
            prs = obj.get("pull_requests")
            numbers = [
                pr["number"]
                for pr in (prs if isinstance(prs, list) else [])[:LIST_CAP]
                if isinstance(pr, Mapping) and _int(pr, "number") is not None
            ]
            return CheckRef(
                name=_str(obj, "name"),
                conclusion=_str(obj, "conclusion"),
                head_sha=_str(obj, "head_sha"),
                head_branch=_str(obj, "head_branch"),
                pull_requests=numbers,
            )
    if "sha" in payload and "state" in payload:  # the `status` event
        return CheckRef(
            name=_str(payload, "context"),
            conclusion=_str(payload, "state"),
            head_sha=_str(payload, "sha"),
        )
    return None


def _repo_names(value: Any) -> list[str]:
    repos = value if isinstance(value, list) else []
    return [
        _utf8(repo["full_name"][:NAME_CAP])
        for repo in repos[:LIST_CAP]
        if isinstance(repo, Mapping) and isinstance(repo.get("full_name"), str)
    ]
