"""Where one registered runner keeps its ledger and status, and the lock that makes it its own.

The default directory is keyed by the runner's id, so two runners registered on one machine
(two deployments, or two capacities) never read each other's sessions. An agent holds an
exclusive lock on its directory for as long as it runs: a second agent on the same state is
refused at start instead of applying dispatches from the first one's ledger.

The directory also keeps the ids of the agent processes that held it (``agent.id``): the one
the server last accepted, then any started since that were killed before the server heard of
them. The next process to take the lock names them, oldest first, as the agent it replaces,
so the server accepts a restart at once, even after a restart that died before it said
hello, and refuses a second agent started elsewhere on the same credentials.
"""

from __future__ import annotations

import fcntl
import os
import re
from pathlib import Path

from looprelay.errors import ConfigError

LOCK_FILE = "agent.lock"
AGENT_ID_FILE = "agent.id"
AGENT_ID = re.compile(r"[A-Za-z0-9_-]{1,64}")
"""What the runner API takes as an agent id (``wire.runner_api``)."""
MAX_UNCONFIRMED_IDS = 8
"""Ids of agents killed before the server accepted them that ``agent.id`` keeps (the newest)."""


def default_state_dir(runner_id: str) -> Path:
    """Return ``$XDG_STATE_HOME/looprelay-runner/<runner_id>`` (``~/.local/state/...``)."""
    state_home = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state_home) / "looprelay-runner" / runner_id


class StateLock:
    """An exclusive, process-lifetime lock on a state directory (released on close or exit)."""

    def __init__(self, fd: int, directory: Path) -> None:
        self._fd = fd
        self.directory = directory

    @classmethod
    def acquire(cls, directory: Path, *, option: str = "its own --state") -> StateLock:
        """Create ``directory`` (mode 0700) and lock it for this process.

        Raises ``ConfigError`` when another agent holds it (naming its pid and ``option``, the
        fix for wanting a second one) or the directory cannot be made.
        """
        try:
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            fd = os.open(directory / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise ConfigError(f"cannot use state directory {directory}: {exc.strerror}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode("ascii", "replace").strip() or "unknown"
            os.close(fd)
            raise ConfigError(
                f"another runner agent (pid {holder}) is using {directory}; stop it first, or: "
                f"{option}"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        return cls(fd, directory)

    def claim_agent_id(self, agent_id: str) -> tuple[str, ...]:
        """Record ``agent_id`` as the newest agent to hold this directory; return the ids
        recorded before, oldest first: the one the server last accepted, then those killed
        before it accepted them. One of them is the agent the server knows, when any is.

        Only the lock's holder calls this, so they are dead agents' ids. Raises
        ``ConfigError`` when the file cannot be written.
        """
        previous = self._recorded()
        kept = (*previous[:1], *previous[1:][-MAX_UNCONFIRMED_IDS:])
        self._record((*kept, agent_id))
        return kept

    def confirm_agent_id(self, agent_id: str) -> None:
        """Record that the server accepted ``agent_id``: the ids before it are forgotten.
        Raises ``ConfigError`` when the file cannot be written."""
        self._record((agent_id,))

    def _recorded(self) -> tuple[str, ...]:
        path = self.directory / AGENT_ID_FILE
        try:
            text = path.read_text(encoding="ascii") if path.exists() else ""
        except (OSError, UnicodeDecodeError):
            text = ""  # unreadable: the server then waits for the old one to fall silent
        return tuple(line for line in text.split() if AGENT_ID.fullmatch(line))

    def _record(self, ids: tuple[str, ...]) -> None:
        path = self.directory / AGENT_ID_FILE
        temporary = path.with_suffix(".tmp")
        try:
            temporary.write_text("".join(f"{i}\n" for i in ids), encoding="ascii")
            temporary.replace(path)
        except OSError as exc:
            raise ConfigError(f"cannot write {path}: {exc.strerror}") from exc

    def release(self) -> None:
        """Give the directory up; closing the descriptor drops the lock."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
