"""The agent's side of the runner API: outbound HTTPS calls only, no inbound port."""

from __future__ import annotations

from typing import Any

import requests

from looprelay.agent.credentials import Credentials
from looprelay.errors import Transient, Unauthorized
from looprelay.wire.runner_api import Dispatch, runner_bearer

CALL_TIMEOUT_SECONDS = 15.0
"""Budget of every call but the long poll, which gets its wait plus this."""


class LeaseLost(Exception):
    """The server gave the lease to another runner: this agent's result no longer counts."""


class BadRequest(Transient):
    """The server refused the body (400): a server older than this agent, or a bug."""


class RunnerClient:
    """Calls ``/runner/v1/...`` with this runner's credentials; thread-safe per call."""

    def __init__(self, credentials: Credentials) -> None:
        self._base = credentials.server.rstrip("/") + "/runner/v1/"
        self._auth = runner_bearer(credentials.runner_id, credentials.secret)
        self.runner_id = credentials.runner_id

    def heartbeat(self, status: dict[str, Any]) -> dict[str, Any]:
        """Report liveness and capacity; returns the server's timing hints."""
        return self._call("heartbeat", status).json() or {}

    def poll(self, wait_seconds: float) -> Dispatch | None:
        """Wait up to ``wait_seconds`` for a dispatch leased to this runner."""
        response = self._call(
            "poll", {"wait_seconds": wait_seconds}, timeout=wait_seconds + CALL_TIMEOUT_SECONDS
        )
        if response.status_code == 204:
            return None
        return Dispatch.model_validate(response.json()["dispatch"])

    def renew(self, dispatch_id: str) -> None:
        """Extend the lease; raises ``LeaseLost`` when it passed to another runner."""
        self._call("renew", {"dispatch_id": dispatch_id})

    def report(self, dispatch_id: str, result: dict[str, Any]) -> None:
        """Report a result; raises ``LeaseLost`` when it no longer counts."""
        self._call("results", {"dispatch_id": dispatch_id, **result})

    def _call(
        self, path: str, body: dict[str, Any], *, timeout: float = CALL_TIMEOUT_SECONDS
    ) -> requests.Response:
        try:
            response = requests.post(
                self._base + path, json=body, timeout=timeout, headers={"Authorization": self._auth}
            )
        except requests.RequestException as exc:
            raise Transient(f"runner API unreachable: {type(exc).__name__}") from exc
        if response.status_code == 401:
            raise Unauthorized(_error(response))
        if response.status_code == 409:
            raise LeaseLost(_error(response))
        if response.status_code >= 500 or response.status_code == 429:
            raise Transient(f"runner API answered {response.status_code}: {_error(response)}")
        if response.status_code == 400:
            raise BadRequest(f"runner API refused {path}: {_error(response)}")
        if response.status_code >= 400:
            raise Transient(f"runner API refused {path}: {_error(response)}")
        return response


def _error(response: requests.Response) -> str:
    try:
        return str(response.json().get("error", ""))[:300]
    except ValueError:
        return response.text[:200]
