"""A session's identity for its harness: the environment ``looprelay session`` reads.

Each harness the agent starts (a tmux spawn, a headless turn) gets a token of its own, minted by
the server for the dispatch being applied, and the session it speaks for. Without a token (the
server unreachable or older than sessions) the harness starts anyway, unable to speak as the
App: a session that cannot comment is better than no session.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from looprelay.agent.client import LeaseLost, RunnerClient
from looprelay.errors import Transient, Unauthorized
from looprelay.wire.runner_api import SESSION_ENV, Dispatch

log = logging.getLogger("looprelay.agent")


class SessionEnv:
    """Builds the environment a harness speaks for its session with, through ``client``."""

    def __init__(self, client: RunnerClient) -> None:
        self._client = client

    def __call__(self, dispatch: Dispatch) -> dict[str, str]:
        """The variables of ``dispatch``'s session (see ``wire.runner_api.SESSION_ENV``), with
        this ``looprelay`` on ``PATH``; empty when the server gave no token (logged)."""
        try:
            issued = self._client.session_token(dispatch.dispatch_id)
        except (Transient, LeaseLost, Unauthorized) as exc:
            log.warning(
                "%s starts without a session token (`looprelay session` cannot post): %s",
                dispatch.endpoint,
                exc,
            )
            return {}
        return {
            SESSION_ENV["api_url"]: self._client.server,
            SESSION_ENV["token"]: issued.token,
            SESSION_ENV["work_item"]: issued.work_item,
            SESSION_ENV["endpoint"]: issued.endpoint,
            "PATH": _with_looprelay(os.environ.get("PATH", "")),
        }


def _with_looprelay(path: str) -> str:
    """``path`` with the directory of the running ``looprelay`` last, if it is not on it."""
    own = str(Path(sys.argv[0]).absolute().parent)
    if not (Path(own) / "looprelay").exists():
        own = str(Path(sys.executable).parent)
    parts = path.split(os.pathsep) if path else []
    return path if own in parts else os.pathsep.join([*parts, own])
