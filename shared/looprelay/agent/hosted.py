"""What the runner says it hosts on each heartbeat: every session of its ledger and the state
its harness is in right now, read from tmux (a headless session runs only during a turn).

Scenario: #7's harness is killed in its pane (or the whole tmux server is). The next heartbeat
names #7's session ``exited``, with the exit status tmux kept, when it died and the pane's last
lines; the server then shows it exited and frees its slot. A tmux server that cannot answer
(wedged) leaves the state unsaid (""): the server keeps what it believed.
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from looprelay.agent.ledger import LocalSession
from looprelay.agent.tmux import TmuxTerminal
from looprelay.core.status import harness_state
from looprelay.errors import RunnerError
from looprelay.wire.runner_api import MAX_LAST_LINES_CHARS

log = logging.getLogger("looprelay.agent")


@dataclass(frozen=True)
class Hosted:
    """One hosted session and its harness's state (``wire.runner_api.HarnessState``)."""

    session: LocalSession
    harness: str
    exit_status: int | None = None
    exited_at: datetime | None = None
    last_lines: str = ""

    def to_wire(self) -> dict[str, object]:
        """The session as a heartbeat's ``held`` names it."""
        body: dict[str, object] = {
            "work_item": self.session.work_item,
            "endpoint": self.session.endpoint,
            "session_name": self.session.session_name,
        }
        if self.harness:
            body["harness"] = self.harness
        if self.exit_status is not None:
            body["exit_status"] = self.exit_status
        if self.exited_at is not None:
            body["exited_at"] = self.exited_at.isoformat()
        if self.last_lines:
            body["last_lines"] = self.last_lines[-MAX_LAST_LINES_CHARS:]
        return body

    def shown(self) -> str:
        """The state as ``runner status`` shows it (``core.status`` words)."""
        return harness_state(self.harness, exit_status=self.exit_status, since=self.exited_at)


def look(
    terminal: TmuxTerminal, sessions: Sequence[LocalSession], *, in_hand: Collection[str]
) -> list[Hosted]:
    """The state of each of ``sessions`` now; ``in_hand`` names the sessions a dispatch is
    being applied to (a headless one runs a turn then, a tmux one not running yet is being
    spawned: unsaid). Never raises: a tmux that cannot answer leaves the tmux sessions'
    states unsaid."""
    found: list[Hosted] = []
    tmux_answers = True
    for session in sessions:
        if session.runner_kind != "tmux":
            state = "running" if session.session_name in in_hand else "idle"
            found.append(Hosted(session, state))
            continue
        if not tmux_answers:
            found.append(Hosted(session, ""))
            continue
        try:
            hosted = _tmux_state(terminal, session)
        except RunnerError as exc:
            log.warning("could not read the sessions' states from tmux: %s", exc)
            tmux_answers = False
            found.append(Hosted(session, ""))
            continue
        if session.session_name in in_hand and hosted.harness != "running":
            hosted = Hosted(session, "")  # being (re)spawned: its result will say
        found.append(hosted)
    return found


def _tmux_state(terminal: TmuxTerminal, session: LocalSession) -> Hosted:
    pane = terminal.pane(session.session_name)
    if pane is None:  # its tmux session, or the whole server, is gone
        return Hosted(session, "exited")
    if not pane.dead:
        return Hosted(session, "running")
    # tmux 3.3a may not know when (nor how) a harness that exited at once ended: now, then.
    died = datetime.fromtimestamp(pane.dead_at, UTC) if pane.dead_at else datetime.now(UTC)
    return Hosted(
        session,
        "exited",
        exit_status=pane.exit_status,
        exited_at=died,
        last_lines=terminal.last_lines(session.session_name),
    )
