"""The agent's side of the runner API: outbound HTTPS calls only, no inbound port."""

from __future__ import annotations

import logging
import os
import threading
from pathlib import Path
from typing import Any

import requests

from looprelay.agent.credentials import Credentials, credentials_lock, read_credentials
from looprelay.errors import ConfigError, Transient, Unauthorized
from looprelay.wire.runner_api import (
    Deregistered,
    Dispatch,
    Rotated,
    SessionToken,
    runner_bearer,
)

log = logging.getLogger("looprelay.agent.client")

CALL_TIMEOUT_SECONDS = 15.0
"""Budget of every call but the long poll, which gets its wait plus this."""


class LeaseLost(Exception):
    """The server gave the lease to another runner: this agent's result no longer counts."""


class SecondAgent(Unauthorized):
    """Another live agent serves this runner (409 on a heartbeat or poll): this one must stop."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=409)


class BadRequest(Transient):
    """The server refused the body (400): a server older than this agent, or a bug."""


class RunnerClient:
    """Calls ``/runner/v1/...`` with this runner's credentials; thread-safe per call.

    Given the credentials file it read them from (``source``), a refused call reads the file
    again and is retried once with a new secret found there: ``looprelay runner rotate`` writes
    it while the agent runs, and the agent goes on without a restart.
    """

    def __init__(self, credentials: Credentials, *, source: Path | None = None) -> None:
        self._credentials = credentials
        self._base = credentials.server.rstrip("/") + "/runner/v1/"
        self._auth = runner_bearer(credentials.runner_id, credentials.secret)
        self._source = source
        self._reload_lock = threading.Lock()
        self.runner_id = credentials.runner_id
        self._idle: list[requests.Session] = []
        """Sessions no call uses now, each keeping its connection open: a call borrows one,
        so the agent holds one connection per call in flight (its polls, a heartbeat, a
        renewal), not one per thread it ever ran (a renewer thread per dispatch)."""
        self._idle_lock = threading.Lock()
        self.sessions_opened = 0
        # The environment's proxy and CA bundle settings, read once: a session trusting the
        # environment reads them again for every call (a tenth of the agent's CPU while it
        # pastes), and would let a netrc entry replace the bearer header.
        self._proxies = requests.utils.get_environ_proxies(self._base)
        self._verify: bool | str = (
            os.environ.get("REQUESTS_CA_BUNDLE") or os.environ.get("CURL_CA_BUNDLE") or True
        )

    def heartbeat(self, status: dict[str, Any]) -> dict[str, Any]:
        """Report liveness and capacity; returns the server's timing hints. Raises
        ``SecondAgent`` when another live agent serves this runner."""
        return self._call("heartbeat", status, conflict=SecondAgent).json() or {}

    def poll(self, wait_seconds: float, *, agent_id: str = "") -> Dispatch | None:
        """Wait up to ``wait_seconds`` for a dispatch leased to this runner; ``agent_id``
        names this agent process. Raises ``SecondAgent`` as :meth:`heartbeat` does."""
        body: dict[str, Any] = {"wait_seconds": wait_seconds}
        if agent_id:
            body["agent_id"] = agent_id
        response = self._call(
            "poll", body, timeout=wait_seconds + CALL_TIMEOUT_SECONDS, conflict=SecondAgent
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

    def session_token(self, dispatch_id: str) -> SessionToken:
        """A new token for the session of the dispatch this runner is applying; raises
        ``LeaseLost`` when its lease passed to another runner, ``Transient`` otherwise."""
        return SessionToken.model_validate(
            self._call("session-token", {"dispatch_id": dispatch_id}).json()
        )

    @property
    def server(self) -> str:
        """The server's base URL, as the credentials name it."""
        return self._credentials.server.rstrip("/")

    def rotate(self) -> str:
        """Ask for a new secret; the current one stops working as the server answers."""
        return Rotated.model_validate(self._call("rotate", {}).json()).secret

    def deregister(self) -> None:
        """Remove this runner at the server: these credentials stop working."""
        Deregistered.model_validate(self._call("deregister", {}).json())

    def _call(
        self,
        path: str,
        body: dict[str, Any],
        *,
        timeout: float = CALL_TIMEOUT_SECONDS,
        conflict: type[Exception] = LeaseLost,
    ) -> requests.Response:
        """POST ``body`` to ``path``; a 409 raises ``conflict`` (a lease lost, by default)."""
        auth = self._auth
        response = self._post(path, body, timeout, auth)
        if response.status_code == 401 and self._reload(refused=auth):
            response = self._post(path, body, timeout, self._auth)
        if response.status_code == 401:
            raise Unauthorized(_error(response))
        if response.status_code == 409:
            raise conflict(_error(response))
        if response.status_code >= 500 or response.status_code == 429:
            raise Transient(f"runner API answered {response.status_code}: {_error(response)}")
        if response.status_code == 400:
            raise BadRequest(f"runner API refused {path}: {_error(response)}")
        if response.status_code >= 400:
            raise Transient(f"runner API refused {path}: {_error(response)}")
        return response

    def _post(
        self, path: str, body: dict[str, Any], timeout: float, auth: str
    ) -> requests.Response:
        session = self._borrow()
        try:
            response = session.post(
                self._base + path, json=body, timeout=timeout, headers={"Authorization": auth}
            )
        except requests.RequestException as exc:
            session.close()  # its connection may be half used: do not lend it again
            raise Transient(f"runner API unreachable: {type(exc).__name__}") from exc
        with self._idle_lock:
            self._idle.append(session)
        return response

    def _borrow(self) -> requests.Session:
        """An idle session, which kept its connection to the server since its last call (the
        one used last first), or a new one."""
        with self._idle_lock:
            if self._idle:
                return self._idle.pop()
            self.sessions_opened += 1
        session = requests.Session()
        session.trust_env = False
        session.proxies = dict(self._proxies)
        session.verify = self._verify
        return session

    def _reload(self, *, refused: str) -> bool:
        """After ``refused`` got a 401: take a new secret for this same runner from the
        credentials file, if it holds one (a rotation). True when there is one to retry with."""
        if self._source is None:
            return False
        with self._reload_lock:
            if self._auth != refused:
                return True  # another thread found it first
            try:
                with credentials_lock(self._source, exclusive=False):
                    fresh = read_credentials(self._source)
            except (ConfigError, OSError):
                return False
            if (fresh.runner_id, fresh.server) != (
                self._credentials.runner_id,
                self._credentials.server,
            ) or fresh.secret == self._credentials.secret:
                return False  # another registration, or no rotation: the refusal stands
            self._credentials = fresh
            self._auth = runner_bearer(fresh.runner_id, fresh.secret)
            log.info("using the new secret in %s (rotated)", self._source)
            return True


def _error(response: requests.Response) -> str:
    try:
        return str(response.json().get("error", ""))[:600]  # the server says who and the fix
    except ValueError:
        return response.text[:200]
