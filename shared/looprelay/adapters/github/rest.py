"""GitHub's REST API behind the ``GitHub`` port, over ``requests`` (docs: "REST API endpoints
for issue comments" and "... for reactions", version 2022-11-28)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping
from typing import Any, TypeVar
from urllib.parse import urlsplit

import requests
from requests.exceptions import ChunkedEncodingError

from looprelay import deadlines
from looprelay.adapters.github import app_hooks, listings
from looprelay.adapters.github import auth as github_auth
from looprelay.config.model import REPOSITORY_NAME, GitHubConfig
from looprelay.errors import Permanent, RateLimited, Transient
from looprelay.ports import CommentText

PER_PAGE = 100  # the most GitHub lists per page
MAX_PAGES = 10  # so find_comment_with reads at most the first 1,000 comments
BACKOFF_BASE_SECONDS = 0.5
MIN_ATTEMPT_SECONDS = 0.5
"""An attempt is not started with less of the task's time budget left."""
REACTION_PATHS = {"issue": "issues/comments", "review": "pulls/comments"}
REACTIONS = frozenset({"+1", "-1", "laugh", "confused", "heart", "hooray", "rocket", "eyes"})
_RETRYABLE = (Transient, requests.ConnectionError, requests.Timeout, ChunkedEncodingError)
# Failures before the request left: the auth exchange, or no connection made at all.
_NOT_SENT = (Transient, requests.ConnectTimeout)
_MAYBE_DONE = "GitHub may have carried it out, so it is not repeated here"
_T = TypeVar("_T")
_HINTS = {
    401: "the credentials are wrong or expired; check github.tokenEnv or the App key",
    403: "the credentials lack a permission (issues and pull requests: write)",
    404: "the repository, issue or comment does not exist or the credentials cannot see it",
    422: "GitHub rejected the request body (a comment holds at most 65,536 characters)",
}


class GitHubRest(app_hooks.AppHookCalls, listings.ListingCalls):
    """The ``GitHub`` port over HTTPS. Every method raises ``ValueError`` for a ``repository``
    not ``owner/name``, ``Permanent`` (naming method, path, status) on a 4xx that is no rate
    limit, and ``Transient`` when its retry budget is spent: ``max_attempts`` (4) attempts per
    request of ``timeout_seconds`` (10 s) each, on 5xx, 429, 403 rate limits, network errors and
    timeouts, waiting between them what ``Retry-After``/``x-ratelimit-reset`` ask (giving up at
    once above ``max_wait_seconds``, 30 s) or else backing off exponentially from 0.5 s with
    jitter. ``create_comment`` is the exception: after an answer that leaves it unknown whether
    the comment was stored (5xx, a timeout or a dropped connection once the request was sent)
    it raises ``Transient`` at once instead of posting again, so the caller can look for its
    marker with ``find_comment_with`` first (``comments.post_once``). Inside a task's time
    budget (``deadlines.within``, the worker's) attempts and waits are cut to fit it, and a
    call raises ``Transient`` once they cannot."""

    def __init__(
        self,
        *,
        api_url: str,
        auth: github_auth.GitHubAuth,
        timeout_seconds: float = 10.0,
        max_attempts: int = 4,
        max_wait_seconds: float = 30.0,
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.time,
    ) -> None:
        """Configure the client; ``sleep`` and ``clock`` (epoch seconds) are test switches."""
        self._api_url, self._auth = api_url.rstrip("/"), auth
        self._timeout, self._max_wait = timeout_seconds, max_wait_seconds
        self._max_attempts = max(1, max_attempts)
        self._sleep, self._clock = sleep, clock
        self._app_quota_reset = 0.0
        self._session = requests.Session()
        self._session.headers.update(github_auth.API_HEADERS)

    @classmethod
    def from_config(cls, cfg: GitHubConfig, environ: Mapping[str, str]) -> GitHubRest:
        """Build the client for ``cfg``, its secrets read from ``environ``; raises
        ``ConfigError`` as ``github_auth.auth_from_config`` does (names the key or variable)."""
        return cls(api_url=cfg.api_url, auth=github_auth.auth_from_config(cfg, environ))

    def create_comment(
        self, *, installation_id: int | None, repository: str, number: int, body: str
    ) -> int:
        """Post ``body`` on issue or pull request ``number``; return the new comment's id."""
        url = self._url(repository, f"issues/{number}/comments")
        answer = self._send("POST", url, installation_id, {"body": body}, repeatable=False)
        # A 201 of the wrong shape may still have stored the comment: Transient lets
        # ``comments.post_once`` look for its marker before posting again.
        return _read(answer, "a comment", _id)

    def find_comment_with(
        self, *, installation_id: int | None, repository: str, number: int, needle: str
    ) -> int | None:
        """Return the id of a comment on ``number`` containing ``needle`` (non-empty, else
        ``ValueError``), reading at most ``MAX_PAGES`` pages: past comment 1,000 it is missed."""
        if not needle:
            raise ValueError("find_comment_with needs a non-empty needle; every body contains ''")
        url: str | None = self._url(repository, f"issues/{number}/comments?per_page={PER_PAGE}")
        for _ in range(MAX_PAGES):
            if url is None:
                break
            response = self._send("GET", url, installation_id)
            found = _read(response, "a list of comments", lambda data: _find(data, needle))
            if found is not None:
                return found
            url = self._next_page(response)
        return None

    def get_comment(
        self, *, installation_id: int | None, repository: str, comment_id: int
    ) -> CommentText | None:
        """Read an issue comment's author and body; None when GitHub answers 404."""
        url = self._url(repository, f"issues/comments/{comment_id}")
        response = self._send("GET", url, installation_id, missing_ok=True)
        if response.status_code == 404:
            return None
        return _read(response, "a comment", _comment_text)

    def add_reaction(
        self,
        *,
        installation_id: int | None,
        repository: str,
        comment_id: int,
        comment_kind: str,
        content: str,
    ) -> None:
        """React with ``content`` to an ``issue`` or ``review`` comment (GitHub answers 200 for an
        existing reaction, 201 for a new one); ``ValueError`` for an unknown kind or content."""
        if comment_kind not in REACTION_PATHS or content not in REACTIONS:
            raise ValueError(f"no {content!r} reaction on {comment_kind!r} comments; see REACTIONS")
        url = self._url(repository, f"{REACTION_PATHS[comment_kind]}/{comment_id}/reactions")
        self._send("POST", url, installation_id, {"content": content})

    def _url(self, repository: str, rest: str) -> str:
        if not REPOSITORY_NAME.fullmatch(repository):
            raise ValueError(f"repository {repository!r} is not owner/name")
        return f"{self._api_url}/repos/{repository}/{rest}"

    def _next_page(self, response: requests.Response) -> str | None:
        url = response.links.get("next", {}).get("url")
        if url and urlsplit(url).netloc != urlsplit(self._api_url).netloc:  # keep the token home
            raise Permanent(f"GitHub {_call(response)}: the next page is on another host {url}")
        return url

    def _send(
        self,
        method: str,
        url: str,
        installation: int | None,
        payload: Any = None,
        *,
        missing_ok: bool = False,
        as_app: bool = False,
        repeatable: bool = True,
        patient: bool = True,
        etag: str = "",
    ) -> requests.Response:
        """One call within the retry budget, as the App if ``as_app``; 404 if ``missing_ok``;
        not ``repeatable``: only repeated when GitHub surely did not carry it out; not
        ``patient``: a rate limit raises ``RateLimited`` at once instead of being waited out;
        ``etag``: asked with ``If-None-Match``, and 304 Not Modified is an answer."""
        conditional = {"If-None-Match": etag} if etag else {}
        call = f"{method} {urlsplit(url).path}"
        for attempt in range(1, self._max_attempts + 1):
            asked: float | None = None
            timeout = self._attempt_timeout(call)
            try:
                headers = self._app_headers() if as_app else self._auth.headers(installation)
                headers = headers | conditional
                response = self._session.request(
                    method, url, headers=headers, json=payload, timeout=timeout
                )
            except _RETRYABLE as exc:  # Transient: from the App token exchange
                failure = f"{type(exc).__name__}: {exc}"
                if not repeatable and not isinstance(exc, _NOT_SENT):
                    raise Transient(f"GitHub {call}: {failure}; {_MAYBE_DONE}") from exc
            else:
                status = response.status_code
                if status < 300 or (status == 404 and missing_ok) or (status == 304 and etag):
                    return response
                failure, asked = f"HTTP {response.status_code}", self._retry_wait(response)
                if not patient and asked is not None:
                    raise RateLimited(
                        f"GitHub {call}: {failure}, rate-limited for {asked:.0f} s", seconds=asked
                    )
                if not repeatable and response.status_code >= 500:
                    raise Transient(f"GitHub {call}: {failure}; {_MAYBE_DONE}")
            if attempt < self._max_attempts:
                wait = asked if asked is not None else _backoff(attempt, self._max_wait)
                self._sleep(self._budgeted_wait(call, wait, failure))
        raise Transient(f"GitHub {call}: failed {self._max_attempts} times, last {failure}")

    def _attempt_timeout(self, call: str) -> float:
        """The attempt's timeout: ``timeout_seconds``, cut to what is left of the task's time
        budget (``deadlines``); Transient once it is spent."""
        left = deadlines.seconds_left()
        if left is None:
            return self._timeout
        if left < MIN_ATTEMPT_SECONDS:
            raise _out_of_budget(call, left)
        return min(self._timeout, left)

    @staticmethod
    def _budgeted_wait(call: str, wait: float, failure: str) -> float:
        """``wait`` before a retry, or Transient when the task's budget cannot hold it and an
        attempt after it: the queue retries the task later, never over a running attempt."""
        left = deadlines.seconds_left()
        if left is None or wait + MIN_ATTEMPT_SECONDS <= left:
            return wait
        raise _out_of_budget(f"{call} after {failure}", left)

    def _retry_wait(self, response: requests.Response) -> float | None:
        """Return the wait GitHub asks for (None: back off); raise when not to retry here."""
        status = response.status_code
        limited = status in (403, 429) or status >= 500
        asked = github_auth.rate_limit_wait(response, self._clock()) if limited else None
        if status < 500 and status != 429 and asked is None:
            hint = _HINTS.get(status, "retrying cannot help")
            raise Permanent(
                f"GitHub {_call(response)}: HTTP {status} {_message(response)!r}; {hint}"
            )
        if asked is not None and asked > self._max_wait:
            raise RateLimited(
                f"GitHub {_call(response)}: HTTP {status}, rate-limited for {asked:.0f} s",
                seconds=asked,
            )
        return asked


def _out_of_budget(call: str, left: float) -> Transient:
    return Transient(
        f"GitHub {call}: {max(left, 0.0):.1f} s left of the task's time budget under the "
        "queue's dispatch deadline; the queue retries the task"
    )


def _call(response: requests.Response) -> str:
    return f"{response.request.method} {urlsplit(response.url).path}"


def _backoff(attempt: int, cap: float) -> float:
    step = min(cap, BACKOFF_BASE_SECONDS * 2.0 ** (attempt - 1))
    return step * random.uniform(0.5, 1.0)  # noqa: S311 - jitter spreads concurrent retries


def _message(response: requests.Response) -> str:
    try:
        return str(response.json().get("message", ""))[:200]
    except (ValueError, AttributeError):  # not JSON, or not an object
        return ""


def _read(response: requests.Response, what: str, read: Callable[[Any], _T]) -> _T:
    """``read`` applied to the JSON answer; ``Transient`` naming ``what`` was expected when the
    answer is not JSON or not of that shape (a proxy's page, a changed API): a best-effort
    side effect then fails alone, and the queue retries a task that needs the answer."""
    try:
        return read(response.json())
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise Transient(f"GitHub {_call(response)}: the answer is not {what}") from exc


def _id(data: Any) -> int:
    value = data["id"]
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError("id is not an integer")
    return value


def _find(comments: Any, needle: str) -> int | None:
    if not isinstance(comments, list):
        raise TypeError("not a list")
    for comment in comments:
        if needle in (comment.get("body") or ""):
            return _id(comment)
    return None


def _comment_text(data: Any) -> CommentText:
    author = str((data.get("user") or {}).get("login", ""))  # null for some deleted users
    body = data["body"] or ""
    if not isinstance(body, str):
        raise TypeError("body is not text")
    return CommentText(comment_id=_id(data), author_login=author, body=body)
