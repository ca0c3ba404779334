"""Build a runner agent from the command line's choices (credentials, checkouts, tmux)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from importlib.metadata import version
from pathlib import Path
from typing import Any

from looprelay.agent.apply import Applier
from looprelay.agent.checkouts import Checkouts, parse_checkout_pairs
from looprelay.agent.client import RunnerClient
from looprelay.agent.credentials import read_credentials
from looprelay.agent.ledger import Ledger
from looprelay.agent.run import Agent, AgentState
from looprelay.agent.tmux import TmuxTerminal

LEDGER_FILE = "ledger.db"
STATUS_FILE = "status.json"


def default_state_dir() -> Path:
    """Return ``$XDG_STATE_HOME/looprelay-runner`` (``~/.local/state/...`` by default)."""
    state_home = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state_home) / "looprelay-runner"


def build_agent(
    *,
    credentials_path: Path,
    state_dir: Path,
    checkout_pairs: Sequence[str],
    workspace: Path | None,
    tmux_socket: str,
    capacity: int,
    poll_wait_seconds: float,
    keep_session_on_terminate: bool = True,
) -> Agent:
    """Assemble the agent. Raises ``ConfigError`` for bad credentials, checkouts or socket."""
    credentials = read_credentials(credentials_path)
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    checkouts = Checkouts(configured=parse_checkout_pairs(checkout_pairs), workspace_root=workspace)
    terminal = TmuxTerminal(tmux_socket)
    ledger = Ledger(state_dir / LEDGER_FILE)
    repositories = sorted(parse_checkout_pairs(checkout_pairs))

    def describe() -> dict[str, Any]:
        # No "capacity": ``capacity`` counts workers applying at once, while the server's
        # capacity is the sessions the runner may hold, fixed when it registered.
        return {
            "version": version("looprelay"),
            "repositories": repositories,
            "workspace": workspace is not None,
            "sessions": ledger.session_count(),
        }

    return Agent(
        client=RunnerClient(credentials),
        applier=Applier(
            terminal, ledger, checkouts, keep_session_on_terminate=keep_session_on_terminate
        ),
        state=AgentState(state_dir / STATUS_FILE),
        describe=describe,
        tmux_socket=tmux_socket,
        capacity=capacity,
        poll_wait_seconds=poll_wait_seconds,
    )
