"""The listings the poll ingress reads, added to ``FakeGitHub`` (``fake.poll``), answered as
GitHub's docs describe ("REST API endpoints for issues", "... for issue comments", "... for
pull request review comments", "... for pull request reviews", "... for issue events", "Best
practices for using the REST API"):

- ``GET /repos/{o}/{r}``, ``.../issues/{n}``, ``.../pulls/{n}``: one object;
- ``GET /repos/{o}/{r}/installation``: the App's installation (needs the App's JWT);
- ``GET .../issues?since=&state=all``, ``.../issues/comments?since=``, ``.../pulls/comments?since=``
  (oldest update first), ``.../pulls/{n}/reviews`` and ``.../issues/events`` (newest first):
  paginated with ``per_page``/``page`` and ``Link: rel="next"``, each page with an ``ETag``; a
  request whose ``If-None-Match`` names the current one is answered 304 and costs no quota;
- with ``quota`` set, every other answer carries ``x-ratelimit-*`` and, once it is spent, a 403
  "API rate limit exceeded" with ``x-ratelimit-remaining: 0`` until a test refills it.

Comments are ``FakeGitHub``'s own (``fake.comments``): those the worker posts are listed too.
Times are whole seconds from ``clock``, as GitHub's.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

if TYPE_CHECKING:
    from tests.fake_github import Answer, FakeGitHub, RecordedRequest

REPOSITORY_ID = 1296269
_REPO = r"/repos/(?P<repo>[^/]+/[^/]+)"
_ROUTES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(_REPO), "_repository"),
    (re.compile(_REPO + r"/installation"), "_installation"),
    (re.compile(_REPO + r"/issues"), "_list_issues"),
    (re.compile(_REPO + r"/issues/events"), "_list_events"),
    (re.compile(_REPO + r"/issues/comments"), "_list_issue_comments"),
    (re.compile(_REPO + r"/pulls/comments"), "_list_review_comments"),
    (re.compile(_REPO + r"/issues/(?P<number>\d+)"), "_get_issue"),
    (re.compile(_REPO + r"/pulls/(?P<number>\d+)"), "_get_pull"),
    (re.compile(_REPO + r"/pulls/(?P<number>\d+)/reviews"), "_list_reviews"),
]


KNOWN_IDS = {"codertocat": 21031067, "octocat": 583231}
"""The fixtures' accounts keep their ids, so a webhook payload and a listing name one user."""


def user(login: str) -> dict[str, Any]:
    """A GitHub account as listings render it; its id is stable for its login."""
    digest = hashlib.sha256(login.encode()).digest()
    known = KNOWN_IDS.get(login.lower(), int.from_bytes(digest[:3], "big") + 1)
    return {"login": login, "id": known, "type": "User"}


@dataclass
class FakeIssue:
    """An issue or pull request (``pull``) of the fake."""

    repository: str
    number: int
    title: str
    author: str
    created_at: datetime
    updated_at: datetime
    pull: bool = False
    state: str = "open"
    labels: list[str] = field(default_factory=list)
    head_ref: str = "feature"
    body: str = ""


@dataclass
class PollListings:
    """The fake's issues, pull requests, reviews and issue events, and its listing routes."""

    fake: FakeGitHub
    repository: str
    """Where ``open_issue`` and the others act (``fake_github.REPOSITORY`` at first)."""
    clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    quota: int | None = None
    """Listing calls left before the rate limit; None: no limit."""
    issues: dict[tuple[str, int], FakeIssue] = field(default_factory=dict)
    reviews: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    comment_times: dict[int, tuple[datetime, datetime]] = field(default_factory=dict)
    not_modified: int = 0
    """304 answers given."""

    # -- what tests do on "GitHub" --------------------------------------------------------

    def open_issue(
        self,
        number: int,
        *,
        title: str = "A bug",
        author: str = "codertocat",
        pull: bool = False,
        body: str = "",
    ) -> FakeIssue:
        """Open issue (or pull request) ``number`` of ``repository``."""
        with self.fake._lock:
            now = self._now()
            issue = FakeIssue(
                self.repository, number, title, author, now, now, pull=pull, body=body
            )
            self.issues[(self.repository, number)] = issue
            return issue

    def label(self, number: int, name: str, *, actor: str = "codertocat") -> None:
        """Add label ``name`` to ``number``, as ``actor``: an issue event."""
        with self.fake._lock:
            issue = self._issue(number)
            issue.labels.append(name)
            self._event(issue, "labeled", actor, label={"name": name, "color": "ededed"})

    def close(self, number: int, *, actor: str = "codertocat") -> None:
        """Close ``number``, as ``actor``."""
        with self.fake._lock:
            issue = self._issue(number)
            issue.state = "closed"
            self._event(issue, "closed", actor)

    def comment(self, number: int, body: str, *, author: str = "codertocat") -> int:
        """Comment on ``number`` as ``author``; return the comment's id."""
        return self._comment(number, body, author, "issue")

    def review_comment(self, number: int, body: str, *, author: str = "codertocat") -> int:
        """A review comment on pull request ``number``; return its id."""
        return self._comment(number, body, author, "review")

    def _comment(self, number: int, body: str, author: str, kind: str) -> int:
        comment_id = self.fake.add_comment(
            body, number=number, author=author, kind=kind, repository=self.repository
        )
        with self.fake._lock:
            now = self._now()
            self.comment_times[comment_id] = (now, now)
            self._issue(number).updated_at = now
        return comment_id

    def review(
        self, number: int, body: str, *, author: str = "codertocat", state: str = "APPROVED"
    ) -> int:
        """Submit a review (``state``: GitHub's upper-case REST state) on ``number``."""
        with self.fake._lock:
            issue, now = self._issue(number), self._now()
            self.fake._next_id += 1
            self.reviews.append(
                {
                    "id": self.fake._next_id,
                    "number": number,
                    "user": user(author),
                    "body": body,
                    "state": state,
                    "commit_id": "c" * 40,
                    "submitted_at": _stamp(now),
                    "author_association": "OWNER",
                }
            )
            issue.updated_at = now
            return int(self.fake._next_id)

    # -- routing ----------------------------------------------------------------------------

    def route(self, request: RecordedRequest) -> Answer | None:
        """Answer a listing request, or None when it is none of these routes."""
        for pattern, name in _ROUTES:
            match = pattern.fullmatch(request.path)
            if match is not None and request.method == "GET":
                return self._answer(request, name, match.groupdict())
        return None

    def _answer(self, request: RecordedRequest, name: str, args: dict[str, str]) -> Answer:
        from tests.fake_github import _error

        repo = args.pop("repo")
        if repo not in self.fake.repositories:
            return _error(404, "Not Found")
        if name == "_installation":
            return self._installation(request)
        if self.fake._login(request.headers) is None:
            return _error(401, "Bad credentials")
        if self.quota is not None and self.quota <= 0:
            status, _, body = _error(403, "API rate limit exceeded for user ID 1.")
            return status, self._limits() | {"x-ratelimit-remaining": "0"}, body
        status, headers, body = getattr(self, name)(request, repo, **args)
        return self._conditional(request, status, headers, body)

    def _conditional(
        self, request: RecordedRequest, status: int, headers: dict[str, str], body: Any
    ) -> Answer:
        if status != 200:
            return status, headers, body
        tag = '"' + hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest() + '"'
        if request.headers.get("if-none-match") == tag:
            self.not_modified += 1
            return 304, {"ETag": tag}, None
        headers = headers | {"ETag": tag}
        if self.quota is not None:
            self.quota -= 1
            headers |= self._limits() | {"x-ratelimit-remaining": str(self.quota)}
        return status, headers, body

    def _limits(self) -> dict[str, str]:
        reset = int(self.fake.clock()) + 3600
        return {"x-ratelimit-limit": "5000", "x-ratelimit-reset": str(reset)}

    def _installation(self, request: RecordedRequest) -> Answer:
        from tests.fake_github import INSTALLATION_ID, _error

        _, _, token = request.headers.get("authorization", "").partition(" ")
        if self.fake._verify_jwt(token) is None:
            return _error(401, "A JSON web token could not be decoded")
        return 200, {}, {"id": INSTALLATION_ID, "app_id": self.fake.app_id}

    def _repository(self, request: RecordedRequest, repo: str) -> Answer:
        return 200, {}, {"id": REPOSITORY_ID, "full_name": repo, "private": False}

    def _get_issue(self, request: RecordedRequest, repo: str, number: str) -> Answer:
        from tests.fake_github import _error

        issue = self.issues.get((repo, int(number)))
        return (200, {}, self._render_issue(issue)) if issue else _error(404, "Not Found")

    def _get_pull(self, request: RecordedRequest, repo: str, number: str) -> Answer:
        from tests.fake_github import _error

        issue = self.issues.get((repo, int(number)))
        if issue is None or not issue.pull:
            return _error(404, "Not Found")
        return 200, {}, self._render_pull(issue)

    def _list_issues(self, request: RecordedRequest, repo: str) -> Answer:
        since = _since(request)
        found = sorted(
            (i for i in self.issues.values() if i.repository == repo and i.updated_at >= since),
            key=lambda i: i.updated_at,
        )
        return self._page(request, [self._render_issue(i) for i in found])

    def _list_events(self, request: RecordedRequest, repo: str) -> Answer:
        found = [e for e in self.events if e["repository"] == repo]
        newest_first = sorted(found, key=lambda e: (e["created_at"], e["id"]), reverse=True)
        rendered = [
            {k: v for k, v in e.items() if k not in ("repository", "number")}
            | {"issue": self._render_issue(self.issues[(repo, e["number"])])}
            for e in newest_first
        ]
        return self._page(request, rendered)

    def _list_issue_comments(self, request: RecordedRequest, repo: str) -> Answer:
        return self._page(request, self._comments(request, repo, "issue"))

    def _list_review_comments(self, request: RecordedRequest, repo: str) -> Answer:
        return self._page(request, self._comments(request, repo, "review"))

    def _list_reviews(self, request: RecordedRequest, repo: str, number: str) -> Answer:
        found = [
            {k: v for k, v in r.items() if k != "number"}
            for r in self.reviews
            if r["number"] == int(number)
        ]
        return self._page(request, found)

    def _comments(self, request: RecordedRequest, repo: str, kind: str) -> list[dict[str, Any]]:
        since, listed = _since(request), []
        for comment in self.fake.comments.values():
            if (comment.repository, comment.kind) != (repo, kind):
                continue
            now = self._now()
            created, updated = self.comment_times.setdefault(comment.id, (now, now))
            if updated < since:
                continue
            author = None if comment.author is None else user(comment.author)
            route, url_key = (
                ("issues", "issue_url") if kind == "issue" else ("pulls", "pull_request_url")
            )
            listed.append(
                {
                    "id": comment.id,
                    "body": comment.body,
                    "user": author,
                    "created_at": _stamp(created),
                    "updated_at": _stamp(updated),
                    "author_association": "OWNER",
                    "html_url": f"https://github.com/{repo}/{route}/{comment.number}",
                    url_key: f"{self.fake.url}/repos/{repo}/{route}/{comment.number}",
                }
            )
        return sorted(listed, key=lambda c: (c["updated_at"], c["id"]))

    def _page(self, request: RecordedRequest, items: list[dict[str, Any]]) -> Answer:
        per_page = min(int(request.query.get("per_page", ["30"])[0]), 100)
        page = int(request.query.get("page", ["1"])[0])
        query = {k: v[0] for k, v in request.query.items() if k != "page"}
        headers = {}
        if page * per_page < len(items):
            link = f"{self.fake.url}{request.path}?{urlencode(query | {'page': page + 1})}"
            headers["Link"] = f'<{link}>; rel="next"'
        return 200, headers, items[(page - 1) * per_page : page * per_page]

    def _render_issue(self, issue: FakeIssue) -> dict[str, Any]:
        route = "pulls" if issue.pull else "issues"
        rendered = {
            "id": issue.number + 5_000_000,
            "number": issue.number,
            "title": issue.title,
            "body": issue.body,
            "state": issue.state,
            "user": user(issue.author),
            "labels": [{"name": name} for name in issue.labels],
            "created_at": _stamp(issue.created_at),
            "updated_at": _stamp(issue.updated_at),
            "html_url": f"https://github.com/{issue.repository}/{route}/{issue.number}",
        }
        if issue.pull:
            rendered["pull_request"] = {
                "url": f"{self.fake.url}/repos/{issue.repository}/pulls/{issue.number}"
            }
        return rendered

    def _render_pull(self, issue: FakeIssue) -> dict[str, Any]:
        repo = {"full_name": issue.repository, "id": REPOSITORY_ID}
        return {
            "number": issue.number,
            "title": issue.title,
            "body": issue.body,
            "state": issue.state,
            "merged": False,
            "draft": False,
            "user": user(issue.author),
            "labels": [{"name": name} for name in issue.labels],
            "head": {"ref": issue.head_ref, "sha": "c" * 40, "repo": repo},
            "base": {"ref": "main", "sha": "b" * 40, "repo": repo},
            "updated_at": _stamp(issue.updated_at),
        }

    def _issue(self, number: int) -> FakeIssue:
        return self.issues[(self.repository, number)]

    def _event(
        self, issue: FakeIssue, action: str, actor: str, *, label: dict[str, str] | None = None
    ) -> None:
        now = self._now()
        issue.updated_at = now
        self.fake._next_id += 1
        event: dict[str, Any] = {
            "id": self.fake._next_id,
            "event": action,
            "actor": user(actor),
            "created_at": _stamp(now),
            "repository": issue.repository,
            "number": issue.number,
        }
        if label is not None:
            event["label"] = label
        self.events.append(event)

    def _now(self) -> datetime:
        return self.clock().astimezone(UTC).replace(microsecond=0)


def _stamp(moment: datetime) -> str:
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _since(request: RecordedRequest) -> datetime:
    text = request.query.get("since", [""])[0]
    return datetime.fromisoformat(text) if text else datetime.min.replace(tzinfo=UTC)
