"""The App's own webhook deliveries behind the ``GitHub`` port (docs: "REST API endpoints for
GitHub App webhooks", version 2022-11-28): list the recent attempts, ask for one again.

These calls authenticate as the App itself, with its JWT; an installation token or a personal
token cannot make them.
"""

from __future__ import annotations

from datetime import datetime
from typing import TYPE_CHECKING, Any

from looprelay.adapters.github.auth import AppAuth, GitHubAuth
from looprelay.errors import Permanent, Transient
from looprelay.ports import AppDelivery

if TYPE_CHECKING:
    import requests

DELIVERIES_PER_PAGE = 100  # the most GitHub lists per page


class AppHookCalls:
    """The App-level calls, mixed into ``GitHubRest``: they go through its ``_send``, so they
    share its retry budget and its error mapping (``Permanent`` on a 4xx, ``Transient`` once the
    budget is spent), with the App's JWT instead of an installation token."""

    _api_url: str
    _auth: GitHubAuth

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
        ) -> requests.Response: ...

        def _next_page(self, response: requests.Response) -> str | None: ...

    def list_app_deliveries(self, *, since: datetime, max_pages: int) -> list[AppDelivery]:
        """List the App's delivery attempts newest first, back to ``since`` (timezone-aware).

        Follows GitHub's cursor pagination (``Link: <...&cursor=...>; rel="next"``) for at most
        ``max_pages`` pages of 100, stopping at the first attempt older than ``since``. Raises
        ``ValueError`` for a naive ``since``, ``Permanent`` without App auth or on a 4xx, and
        ``Transient`` when an answer is not a list of deliveries or the retry budget is spent.
        """
        if since.tzinfo is None:
            raise ValueError("since must be timezone-aware (GitHub's times are UTC)")
        url: str | None = f"{self._api_url}/app/hook/deliveries?per_page={DELIVERIES_PER_PAGE}"
        found: list[AppDelivery] = []
        for _ in range(max_pages):
            if url is None:
                break
            response = self._send("GET", url, None, as_app=True)
            page = _deliveries(response)
            found.extend(delivery for delivery in page if delivery.delivered_at >= since)
            if any(delivery.delivered_at < since for delivery in page):
                break
            url = self._next_page(response)
        return found

    def redeliver(self, *, delivery_id: int) -> None:
        """Ask GitHub to deliver attempt ``delivery_id`` again (it answers 202 Accepted).

        A retried request may redeliver twice; the ledger makes the second a no-op. Raises
        ``Permanent`` without App auth or on a 4xx (404: no such attempt, or older than GitHub
        keeps), ``Transient`` when the retry budget is spent.
        """
        url = f"{self._api_url}/app/hook/deliveries/{int(delivery_id)}/attempts"
        self._send("POST", url, None, as_app=True)

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
