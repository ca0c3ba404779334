"""The App's own webhook deliveries behind the ``GitHub`` port (docs: "REST API endpoints for
GitHub App webhooks", version 2022-11-28): list the recent attempts, ask for one again.

These calls authenticate as the App itself, with its JWT; an installation token or a personal
token cannot make them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any

from looprelay.adapters.github import auth as github_auth
from looprelay.adapters.github.auth import AppAuth, GitHubAuth
from looprelay.errors import Permanent, Transient
from looprelay.ports import AppDelivery, DeliveryPage

if TYPE_CHECKING:
    import requests

DELIVERIES_PER_PAGE = 100  # the most GitHub lists per page


class AppHookCalls:
    """The App-level calls, mixed into ``GitHubRest``: they go through its ``_send``, so they
    share its retry budget and its error mapping (``Permanent`` on a 4xx, ``Transient`` once the
    budget is spent), with the App's JWT instead of an installation token."""

    _api_url: str
    _auth: GitHubAuth
    _clock: Callable[[], float]
    _app_quota_reset: float = 0.0
    """Epoch seconds until which the App's quota is spent (``x-ratelimit-remaining: 0``)."""

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
        ) -> requests.Response: ...

        def _next_page(self, response: requests.Response) -> str | None: ...

    def app_delivery_pages(self, *, since: datetime) -> Iterator[DeliveryPage]:
        """Yield the App's delivery attempts newest first, a page of 100 at a time, back to
        ``since`` (timezone-aware; older attempts on the last page are dropped).

        Follows GitHub's cursor pagination (``Link: <...&cursor=...>; rel="next"``). A
        rate-limited answer, or a spent quota (``x-ratelimit-remaining: 0`` on the previous
        answer), raises ``Transient`` at once instead of waiting: the caller keeps the pages it
        has and leaves the rest for later. Raises ``ValueError`` for a naive ``since``,
        ``Permanent`` without App auth or on a 4xx, and ``Transient`` when an answer is not a
        list of deliveries or the retry budget is spent.
        """
        if since.tzinfo is None:
            raise ValueError("since must be timezone-aware (GitHub's times are UTC)")
        url: str | None = f"{self._api_url}/app/hook/deliveries?per_page={DELIVERIES_PER_PAGE}"
        while url is not None:
            response = self._send_as_app("GET", url)
            page = _deliveries(response)
            url = self._next_page(response)
            reached = any(delivery.delivered_at < since for delivery in page)
            kept = [delivery for delivery in page if delivery.delivered_at >= since]
            yield DeliveryPage(deliveries=kept, last=reached or url is None)
            if reached:
                return

    def redeliver(self, *, delivery_id: int) -> None:
        """Ask GitHub to deliver attempt ``delivery_id`` again (it answers 202 Accepted).

        A retried request may redeliver twice; the ledger makes the second a no-op. Raises
        ``Permanent`` without App auth or on a 4xx (404: no such attempt, or older than GitHub
        keeps), ``Transient`` at once when rate-limited (as ``app_delivery_pages``) and when the
        retry budget is spent.
        """
        url = f"{self._api_url}/app/hook/deliveries/{int(delivery_id)}/attempts"
        self._send_as_app("POST", url)

    def _send_as_app(self, method: str, url: str) -> requests.Response:
        """One App call that never waits out a rate limit: GitHub's quota for the App is
        shared by every run, so a sweep stops and leaves the rest for the next one."""
        left = self._app_quota_reset - self._clock()
        if left > 0:
            raise Transient(
                f"GitHub's rate limit for the App is spent for {left:.0f} s more; "
                "the rest waits for the next sweep"
            )
        response = self._send(method, url, None, as_app=True, patient=False)
        reset = github_auth.quota_spent_until(response)
        if reset is not None:
            self._app_quota_reset = reset
        return response

    def _app_headers(self) -> dict[str, str]:
        """The App's JWT as the ``Authorization`` header; ``Permanent`` for other auth."""
        if not isinstance(self._auth, AppAuth):
            raise Permanent(
                "listing and redelivering the App's webhook deliveries needs App auth: set "
                "github.appId and github.privateKeyEnv (a token cannot make these calls)"
            )
        return {"Authorization": f"Bearer {self._auth.app_jwt()}"}


def _deliveries(response: requests.Response) -> list[AppDelivery]:
    try:
        return [
            AppDelivery(
                id=int(item["id"]),
                guid=str(item["guid"]),
                delivered_at=_aware(datetime.fromisoformat(str(item["delivered_at"]))),
                status_code=int(item["status_code"] or 0),
                redelivery=bool(item["redelivery"]),
                event=str(item["event"]),
            )
            for item in response.json()
        ]
    except (ValueError, KeyError, TypeError) as exc:
        path = response.request.path_url.split("?")[0]
        raise Transient(f"GitHub GET {path}: the answer is not a list of deliveries") from exc


def _aware(moment: datetime) -> datetime:
    if moment.tzinfo is None:  # GitHub writes UTC with a "Z"; anything else is no answer of its
        raise ValueError("delivered_at has no timezone")
    return moment
