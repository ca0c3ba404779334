"""The poll ingress: GitHub's REST listings read on a schedule, each new item queued as the
webhook delivery it stands for, through the same admission (``service.ingress.admit_payload``),
queue, worker, policy and order as the webhook's. No public URL is needed.

One poll of a repository reads, each asked conditionally with the ETag of its last answer (a
304 costs no rate limit) and since its cursor minus ``github.poll.overlapSeconds``:

1. ``issues?since=&state=all``: what changed, and what was opened; the reviews of each pull
   request in it (``pulls/{n}/reviews``);
2. ``issues/events``: labels added and removed, closes and reopens, with who did them;
3. ``issues/comments?since=``; 4. ``pulls/comments?since=``.

Every delivery found is queued oldest first; only when all are queued do the cursors move (to
the newest item each listing returned) and the ETags get saved, so a poll cut short reads the
same stretch again. What is listed twice (the overlap, a repeated poll) is not queued again
when the ledger or this process already has it, and the ledger settles a delivery once anyway.
A fresh cursor starts when polling begins: history is never replayed.

GitHub's rate limits are obeyed, never called through: an answer asking to wait
(``Retry-After``, ``x-ratelimit-remaining: 0`` until ``x-ratelimit-reset``, a secondary limit)
stops the repository's poll and records ``retry_at`` on its cursors, and polls before it are
skipped. Each cursor also records the last poll that read it whole and the last error, which
``status`` shows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from secrets import token_hex
from typing import Any
from urllib.parse import urlencode

from looprelay.config.model import PollConfig, WebhookConfig
from looprelay.core.envelope import parse_moment
from looprelay.core.poll import (
    ISSUE_COMMENTS,
    ISSUE_EVENTS,
    ISSUES,
    LISTINGS,
    REVIEW_COMMENTS,
    PollCursor,
    PolledDelivery,
    PollTarget,
    advanced,
    comment_delivery,
    is_pull_request,
    issue_event_delivery,
    issue_number,
    listing_since,
    new_cursor,
    opened_delivery,
    review_comment_delivery,
    review_delivery,
)
from looprelay.errors import Permanent, RateLimited, Transient
from looprelay.ports import Clock, GitHubListings, Listing, PollCursors, Queue, Store
from looprelay.service.ingress import Refusal, acknowledge, admit_payload

log = logging.getLogger("looprelay.service.poller")

PERMANENT_BACKOFF = timedelta(minutes=10)
"""How long a repository GitHub refuses (not installed, no access) is left alone."""
RECENT_LIMIT = 5_000
"""Delivery ids this process remembers having queued, so the overlap is not queued again
before the worker has recorded it."""


@dataclass(frozen=True)
class RepositoryPoll:
    """What one poll of one repository did."""

    repository: str
    queued: int = 0
    seen: int = 0
    """Deliveries found that the ledger or this process had already."""
    unchanged: int = 0
    """Listings GitHub answered 304 Not Modified."""
    error: str = ""
    retry_at: datetime | None = None
    """Not polled again before then (GitHub asked to wait, or refused)."""
    skipped: bool = False
    """Not polled at all: still backing off until ``retry_at``."""


@dataclass
class _Read:
    """One poll's findings, before anything is queued or saved."""

    deliveries: list[PolledDelivery] = field(default_factory=list)
    cursors: dict[str, PollCursor] = field(default_factory=dict)
    unchanged: int = 0
    quota_reset: float | None = None


class _Items:
    """The issues and pull requests one poll needs, each read at most once."""

    def __init__(
        self, github: GitHubListings, installation_id: int | None, repository: str
    ) -> None:
        self._github, self._installation, self._repository = github, installation_id, repository
        self.issues: dict[int, Mapping[str, Any]] = {}
        self._pulls: dict[int, Mapping[str, Any] | None] = {}

    def issue(self, number: int) -> Mapping[str, Any] | None:
        if number not in self.issues:
            found = self._get(f"issues/{number}")
            if found is None:
                return None
            self.issues[number] = found
        return self.issues[number]

    def pull(self, number: int) -> Mapping[str, Any] | None:
        if number not in self._pulls:
            self._pulls[number] = self._get(f"pulls/{number}")
        return self._pulls[number]

    def _get(self, path: str) -> dict[str, Any] | None:
        return self._github.get_object(
            installation_id=self._installation, repository=self._repository, path=path
        )


class _Reading:
    """One poll of one repository: each listing read, what it holds turned into deliveries."""

    def __init__(
        self,
        github: GitHubListings,
        repository: str,
        target: PollTarget,
        cursors: Mapping[str, PollCursor],
        quiet_since: datetime,
    ) -> None:
        """``quiet_since``: a listing whose newest item is older is asked with its ETag."""
        self._github, self._repository, self._target = github, repository, target
        self._cursors, self._quiet_since = cursors, quiet_since
        self._items = _Items(github, target.installation_id, repository)
        self.read = _Read()

    def issues(self, since: datetime) -> None:
        """What changed; the reviews of each pull request among it."""
        changed = self._list(ISSUES, "issues", since)
        for issue in changed:
            number = issue.get("number")
            if not isinstance(number, int):
                continue
            self._items.issues[number] = issue
            pull = self._items.pull(number) if is_pull_request(issue) else None
            if pull is None and is_pull_request(issue):
                continue  # deleted meanwhile
            self._add(opened_delivery(issue, pull_request=pull, since=since, target=self._target))
            if pull is not None:
                self._add_reviews(number, pull, since)
        self._advance(ISSUES, changed, "updated_at")

    def issue_events(self, since: datetime) -> None:
        """Labels added and removed, closes and reopens, oldest first."""
        events = self._list(ISSUE_EVENTS, "issues/events", since, newest_first=True)
        for event in reversed(events):
            issue = event.get("issue")
            if not isinstance(issue, Mapping) or not isinstance(issue.get("number"), int):
                continue
            pull = self._items.pull(issue["number"]) if is_pull_request(issue) else None
            if pull is None and is_pull_request(issue):
                continue  # deleted meanwhile
            self._add(
                issue_event_delivery(event, pull_request=pull, since=since, target=self._target)
            )
        self._advance(ISSUE_EVENTS, events, "created_at")

    def issue_comments(self, since: datetime) -> None:
        """New comments on issues and pull requests."""
        comments = self._list(ISSUE_COMMENTS, "issues/comments", since)
        for comment in comments:
            number = issue_number(comment, "issue_url")
            issue = self._items.issue(number) if number is not None else None
            if issue is not None:
                self._add(comment_delivery(comment, issue=issue, since=since, target=self._target))
        self._advance(ISSUE_COMMENTS, comments, "updated_at")

    def review_comments(self, since: datetime) -> None:
        """New review comments on pull requests' diffs."""
        notes = self._list(REVIEW_COMMENTS, "pulls/comments", since)
        for note in notes:
            number = issue_number(note, "pull_request_url")
            pull = self._items.pull(number) if number is not None else None
            if pull is not None:
                self._add(
                    review_comment_delivery(
                        note, pull_request=pull, since=since, target=self._target
                    )
                )
        self._advance(REVIEW_COMMENTS, notes, "updated_at")

    def _add(self, delivery: PolledDelivery | None) -> None:
        if delivery is not None:
            self.read.deliveries.append(delivery)

    def _list(
        self, listing: str, path: str, since: datetime, *, newest_first: bool = False
    ) -> list[dict[str, Any]]:
        """One listing, conditionally: its items (none when unchanged), its new ETag kept on
        the cursor the poll saves. A newest-first listing takes no ``since``: it is read back
        to it."""
        cursor = self._cursors[listing]
        # GitHub's times have whole seconds: a change in the second of the newest item listed
        # may leave the listing's bytes (so its ETag) as they were (a review only moves its
        # pull request's updated_at). Until the listing has been quiet for the overlap, it is
        # read whole, and what it lists again is deduplicated.
        quiet = cursor.since < self._quiet_since
        params = {} if newest_first else _since_params(path, since)
        request = f"{path}?{urlencode(params)}"
        found: Listing = self._github.list_all(
            installation_id=self._target.installation_id,
            repository=self._repository,
            path=path,
            params=params,
            etag=cursor.etag if cursor.etag_url == request and quiet else "",
            back_to=since if newest_first else None,
        )
        read = self.read
        read.quota_reset = _later(read.quota_reset, found.quota_reset)
        read.unchanged += found.unchanged
        read.cursors[listing] = cursor.model_copy(update={"etag": found.etag, "etag_url": request})
        return found.items

    def _add_reviews(self, number: int, pull: Mapping[str, Any], since: datetime) -> None:
        reviews = self._github.list_all(
            installation_id=self._target.installation_id,
            repository=self._repository,
            path=f"pulls/{number}/reviews",
            params={},
        ).items
        for review in reviews:
            self._add(review_delivery(review, pull_request=pull, since=since, target=self._target))

    def _advance(self, listing: str, items: Iterable[Mapping[str, Any]], key: str) -> None:
        moments = [m for item in items if (m := parse_moment(item.get(key))) is not None]
        self.read.cursors[listing] = advanced(
            self.read.cursors[listing], max(moments, default=None)
        )


class Poller:
    """Polls the configured repositories; one instance per process, one poll at a time."""

    def __init__(
        self,
        *,
        github: GitHubListings,
        cursors: PollCursors,
        ledger: Store,
        queue: Queue,
        clock: Clock,
        config: PollConfig,
        webhook: WebhookConfig,
        wall_clock: Callable[[], float] | None = None,
        new_attempt: Callable[[], str] = lambda: token_hex(8),
    ) -> None:
        """``webhook`` caps the envelopes' text and names the events routed (others are not
        queued); ``wall_clock`` (epoch seconds, default ``clock``'s) reads GitHub's
        ``x-ratelimit-reset``."""
        self._github, self._cursors, self._ledger, self._queue = github, cursors, ledger, queue
        self._clock, self._config, self._webhook = clock, config, webhook
        self._epoch = wall_clock or (lambda: clock.now().timestamp())
        self._new_attempt = new_attempt
        self._overlap = timedelta(seconds=config.overlap_seconds)
        self._allowed = webhook.allowed_events()
        self._targets: dict[str, tuple[int | None, dict[str, Any]]] = {}
        self._recent: dict[str, None] = {}

    def run(self) -> list[RepositoryPoll]:
        """Poll every configured repository once; never raises for GitHub (each
        repository's failure is in its report and its cursors), ``Transient`` for the store."""
        return [self.poll(repository) for repository in self._config.repositories]

    def poll(self, repository: str) -> RepositoryPoll:
        """Poll ``repository`` once, unless it is backing off."""
        now = self._clock.now()
        cursors = {
            listing: self._cursors.get_poll_cursor(repository, listing)
            or new_cursor(repository, listing, now=now)
            for listing in LISTINGS
        }
        waiting = max((c.retry_at for c in cursors.values() if c.retry_at), default=None)
        if waiting is not None and waiting > now:
            return RepositoryPoll(repository, retry_at=waiting, skipped=True)
        try:
            read = self._read(repository, cursors)
            queued, seen = self._enqueue(read.deliveries)
        except RateLimited as exc:
            wait = max(exc.seconds, self._config.interval_seconds)
            return self._failed(repository, cursors, now, exc, now + timedelta(seconds=wait))
        except Permanent as exc:
            self._targets.pop(repository, None)  # the App may be installed anew meanwhile
            return self._failed(repository, cursors, now, exc, now + PERMANENT_BACKOFF)
        except Transient as exc:
            return self._failed(repository, cursors, now, exc, None)
        retry_at = self._from_epoch(read.quota_reset, now)
        for cursor in read.cursors.values():
            self._cursors.save_poll_cursor(
                cursor.model_copy(
                    update={"polled_at": now, "error": "", "failed_at": None, "retry_at": retry_at}
                )
            )
        if queued:
            log.info("polled %s: %d queued", repository, queued)
        return RepositoryPoll(
            repository, queued=queued, seen=seen, unchanged=read.unchanged, retry_at=retry_at
        )

    def _read(self, repository: str, cursors: Mapping[str, PollCursor]) -> _Read:
        installation, repo = self._target(repository)
        reading = _Reading(
            self._github, repository, PollTarget(repo, installation), cursors, self._quiet_since()
        )
        overlap = self._overlap
        reading.issues(listing_since(cursors[ISSUES], overlap=overlap))
        reading.issue_events(listing_since(cursors[ISSUE_EVENTS], overlap=overlap))
        reading.issue_comments(listing_since(cursors[ISSUE_COMMENTS], overlap=overlap))
        reading.review_comments(listing_since(cursors[REVIEW_COMMENTS], overlap=overlap))
        reading.read.deliveries.sort(key=lambda found: found.happened_at)
        return reading.read

    def _quiet_since(self) -> datetime:
        return self._clock.now() - self._overlap

    def _target(self, repository: str) -> tuple[int | None, dict[str, Any]]:
        """The installation serving ``repository`` and the repository as GitHub names it,
        read once a process."""
        if repository not in self._targets:
            installation = self._github.repository_installation(repository)
            repo = self._github.get_object(installation_id=installation, repository=repository)
            if repo is None:
                raise Permanent(f"GitHub knows no repository {repository} these credentials see")
            kept = {key: repo.get(key) for key in ("id", "full_name", "private", "html_url")}
            self._targets[repository] = (installation, kept)
        return self._targets[repository]

    def _enqueue(self, deliveries: list[PolledDelivery]) -> tuple[int, int]:
        """Queue each delivery not had yet, oldest first; ``Transient`` at the first the queue
        does not take (the cursors then stay, and the next poll finds the rest again)."""
        queued = seen = 0
        for found in deliveries:
            if found.event not in self._allowed:
                continue
            if found.delivery_id in self._recent or self._ledger.get_delivery(found.delivery_id):
                seen += 1
                continue
            admission = admit_payload(
                event=found.event,
                delivery_id=found.delivery_id,
                payload=found.payload,
                config=self._webhook,
                received_at=found.happened_at,
                attempt=self._new_attempt(),
            )
            answer = acknowledge(admission, partial(self._queue.enqueue, admission.task))
            if isinstance(answer, Refusal):
                raise Transient(f"the queue did not take {found.delivery_id}: {answer.message}")
            self._remember(found.delivery_id)
            queued += 1
        return queued, seen

    def _remember(self, delivery_id: str) -> None:
        self._recent[delivery_id] = None
        if len(self._recent) > RECENT_LIMIT:
            del self._recent[next(iter(self._recent))]

    def _failed(
        self,
        repository: str,
        cursors: Mapping[str, PollCursor],
        now: datetime,
        exc: Exception,
        retry_at: datetime | None,
    ) -> RepositoryPoll:
        error = str(exc)[:500]
        log.warning("polling %s failed: %s", repository, error)
        for cursor in cursors.values():
            self._cursors.save_poll_cursor(
                cursor.model_copy(update={"failed_at": now, "error": error, "retry_at": retry_at})
            )
        return RepositoryPoll(repository, error=error, retry_at=retry_at)

    def _from_epoch(self, epoch: float | None, now: datetime) -> datetime | None:
        if epoch is None:
            return None
        return now + timedelta(seconds=max(epoch - self._epoch(), 0.0))


def _since_params(path: str, since: datetime) -> dict[str, str]:
    stamp = since.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")  # GitHub's ISO 8601, whole seconds
    params = {"since": stamp, "sort": "updated", "direction": "asc"}
    return params | {"state": "all"} if path == "issues" else params


def _later(one: float | None, other: float | None) -> float | None:
    return max((x for x in (one, other) if x is not None), default=None)
