"""The poll ingress's reads behind the ``GitHubListings`` port (docs: "REST API endpoints for
issues", "... for issue comments", "... for pull request review comments", "... for pull
request reviews", "... for issue events", "Best practices for using the REST API": conditional
requests and pagination), mixed into ``GitHubRest``.

A listing is asked with the ETag of its last first page (``If-None-Match``): unchanged, GitHub
answers 304, which does not count against the rate limit. Pages follow ``Link: rel="next"``.
A rate limit is never waited out here: ``RateLimited`` tells the poller how long to back off.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from looprelay.adapters.github import auth as github_auth
from looprelay.core.envelope import parse_moment
from looprelay.errors import Permanent, RateLimited, Transient
from looprelay.ports import Listing

if TYPE_CHECKING:
    import requests

LISTING_PER_PAGE = 100  # the most GitHub lists per page


class ListingCalls:
    """The poll ingress's calls, mixed into ``GitHubRest``: through its ``_send``, so they share
    its retry budget and error mapping, impatient (a rate limit raises at once)."""

    _clock: Callable[[], float]

    if TYPE_CHECKING:

        def _send(
            self,
            method: str,
            url: str,
            installation: int | None,
            payload: Any = None,
            *,
            missing_ok: bool = False,
            as_app: bool = False,
            patient: bool = True,
            etag: str = "",
        ) -> requests.Response: ...

        def _next_page(self, response: requests.Response) -> str | None: ...

        def _url(self, repository: str, rest: str) -> str: ...

    def list_all(
        self,
        *,
        installation_id: int | None,
        repository: str,
        path: str,
        params: Mapping[str, str],
        etag: str = "",
        max_pages: int = 10,
        back_to: datetime | None = None,
    ) -> Listing:
        """See ``GitHubListings.list_all``. Raises ``ValueError`` for a ``repository`` not
        ``owner/name``, ``Transient`` when an answer is no list, and ``RateLimited`` (with the
        wait) when a later page finds the quota spent: the pages read are lost, the cursor
        stays, the next poll reads them again."""
        query = urlencode({**params, "per_page": str(LISTING_PER_PAGE)})
        url: str | None = self._url(repository, f"{path}?{query}")
        items: list[dict[str, Any]] = []
        first_etag, reset = "", None
        for page in range(max_pages):
            if url is None:
                break
            if reset is not None:
                raise RateLimited(
                    f"GitHub's rate limit is spent mid-listing of {repository} {path}",
                    seconds=max(reset - self._clock(), 0.0),
                )
            response = self._send("GET", url, installation_id, patient=False, etag=etag)
            reset = github_auth.quota_spent_until(response)
            if page == 0:
                if response.status_code == 304:
                    return Listing(items=[], etag=etag, unchanged=True, quota_reset=reset)
                first_etag, etag = response.headers.get("etag", ""), ""
            page_items = _objects(response)
            items.extend(page_items)
            url = self._next_page(response)
            if back_to is not None and _reaches(page_items, back_to):
                break
        return Listing(items=items, etag=first_etag, quota_reset=reset)

    def get_object(
        self, *, installation_id: int | None, repository: str, path: str = ""
    ) -> dict[str, Any] | None:
        """See ``GitHubListings.get_object``; ``Transient`` when the answer is no object."""
        url = self._url(repository, path).rstrip("/")
        response = self._send("GET", url, installation_id, patient=False, missing_ok=True)
        if response.status_code == 404:
            return None
        data = _decoded(response)
        if not isinstance(data, dict):
            raise Transient(f"GitHub GET {response.request.path_url}: the answer is no object")
        return data

    def repository_installation(self, repository: str) -> int | None:
        """See ``GitHubListings.repository_installation``; ``Permanent`` when the App is not
        installed on ``repository`` (404)."""
        if not isinstance(getattr(self, "_auth", None), github_auth.AppAuth):
            return None
        url = self._url(repository, "installation")
        response = self._send("GET", url, None, as_app=True, patient=False, missing_ok=True)
        if response.status_code == 404:
            raise Permanent(f"the GitHub App is not installed on {repository}; install it there")
        data = _decoded(response)
        installation = data.get("id") if isinstance(data, dict) else None
        if not isinstance(installation, int):
            raise Transient(f"GitHub GET /repos/{repository}/installation: no installation id")
        return installation


def _reaches(items: list[dict[str, Any]], moment: datetime) -> bool:
    times = [parse_moment(item.get("created_at")) for item in items]
    return any(time is not None and time < moment for time in times)


def _decoded(response: requests.Response) -> Any:
    try:
        return response.json()
    except ValueError as exc:
        raise Transient(f"GitHub GET {response.request.path_url}: the answer is not JSON") from exc


def _objects(response: requests.Response) -> list[dict[str, Any]]:
    data = _decoded(response)
    if not isinstance(data, list):
        raise Transient(f"GitHub GET {response.request.path_url}: the answer is not a list")
    return [item for item in data if isinstance(item, dict)]
