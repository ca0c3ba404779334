"""The shell command an operator runs to watch a session: one spelling for the agent, its
status, the attach comment on GitHub and the status page."""

from __future__ import annotations

import shlex

SOCKET_PREFIX = "looprelay-"


def runner_socket(runner_id: str) -> str:
    """Return the tmux socket a runner uses unless told otherwise (``looprelay-<runner id>``):
    its own, so two runners on one machine never share sessions."""
    return f"{SOCKET_PREFIX}{runner_id}"


def attach_command(*, socket: str, session: str, read_only: bool = False) -> str:
    """Return ``tmux -L SOCKET attach -t SESSION`` (``attach -r`` when ``read_only``), each
    name quoted for a POSIX shell. Never raises."""
    flag = " -r" if read_only else ""
    return f"tmux -L {shlex.quote(socket)} attach{flag} -t {shlex.quote(session)}"
