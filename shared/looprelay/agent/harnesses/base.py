"""The one interface every coding-agent CLI sits behind, and the parts they share.

A :class:`Harness` is plain values plus pure argv builders and an output parser; the only I/O
is :meth:`Harness.prepare` (the harness's own config files under ``$HOME``) and
:meth:`Harness.id_in_use`. No prompt ever goes into argv (any local user can read
``/proc/PID/cmdline``): a hosted harness gets its boot prompt as a bracketed paste, a headless
turn reads it on stdin. A session id reaches argv only as a canonical UUID.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from looprelay.agent.harnesses.output import Turn
from looprelay.errors import RunnerError

_SESSION_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
AGENT_SKILLS = (".agents", "skills")
"""The Agent Skills folder Codex, Gemini CLI and Copilot CLI all read below their working tree."""


def is_session_id(value: str) -> bool:
    """Tell whether ``value`` is a canonical lower-case UUID, the only id argv may carry."""
    return _SESSION_ID.fullmatch(value) is not None


def check_session_id(session_id: str) -> None:
    """Raise ``RunnerError`` ``invalid-session-id`` unless ``session_id`` may go into argv."""
    if not is_session_id(session_id):
        raise RunnerError(
            "the session id is not a canonical UUID and never goes into argv",
            reason="invalid-session-id",
        )


def required_id(session_id: str | None) -> str:
    """``session_id``, which a harness that takes ids needs on every turn; raises
    ``RunnerError`` ``invalid-session-id`` when it is missing or not a canonical UUID."""
    if session_id is None:
        raise RunnerError("a headless turn needs a session id", reason="invalid-session-id")
    check_session_id(session_id)
    return session_id


@dataclass(frozen=True)
class Harness(ABC):
    """One coding-agent CLI: what it is called, where it reads things, how it is run.

    ``binary`` is looked up on ``PATH``; ``hostable`` says it can live in a tmux pane;
    ``takes_session_id`` that a fresh session can start under an id the agent chooses
    (otherwise the harness picks one on its first headless turn and prints it);
    ``skill_dir`` is where the loop's skill goes below the session's tree, in the form this
    harness reads; ``home_paths`` its config under ``$HOME`` (bound read-write in the sandbox);
    ``config_paths`` / ``config_names`` the repository paths it reads as configuration (at the
    root / at any depth), which an untrusted tree gets from the base; ``owned_flags`` the flags
    the agent sets itself, refused in ``--harness-arg``; ``confirm_submit`` that a paste's
    Enter may be dropped or read as a newline, so every paste is watched until the harness
    took it, by its first line or by ``paste_placeholder``, what the input box shows instead
    of a long paste;
    ``hosted_unset`` the variables a hosted session must not inherit from the agent, because
    they would turn the harness away from the terminal it is hosted in.
    """

    name: str
    binary: str
    hostable: bool
    takes_session_id: bool
    skill_dir: tuple[str, ...]
    home_paths: tuple[str, ...] = ()
    config_paths: tuple[str, ...] = ()
    config_names: tuple[str, ...] = ()
    owned_flags: frozenset[str] = frozenset()
    confirm_submit: bool = False
    paste_placeholder: str = ""
    hosted_unset: tuple[str, ...] = ()

    def hosted_argv(
        self, binary: str, *, session_id: str, resume: bool, extra: Sequence[str]
    ) -> list[str]:
        """The argv of the harness hosted in tmux (spawn, or resume ``session_id``).

        Raises ``RunnerError`` ``harness-unsupported`` for a harness that cannot be hosted and
        ``invalid-session-id`` for an id that is not a canonical UUID.
        """
        raise RunnerError(
            f"{self.name} cannot be hosted in tmux; use runner kind 'process' for it",
            reason="harness-unsupported",
        )

    @abstractmethod
    def headless_argv(
        self, binary: str, *, session_id: str | None, resume: bool, extra: Sequence[str]
    ) -> list[str]:
        """The argv of one headless turn, which reads its prompt on stdin. ``session_id`` is
        None only for a first turn of a harness that names its own sessions."""

    @abstractmethod
    def parse_turn(self, *, exit_code: int, stdout: str, stderr: str) -> Turn:
        """What one headless turn came to, from its exit code and output. Never raises."""

    def prepare(
        self,
        tree: Path,
        *,
        harness_args: Sequence[str],
        environ: Mapping[str, str],
        trust: bool,
        trusted: bool,
    ) -> list[str]:
        """Make the harness's own files ready for a session in ``tree`` (folder trust and the
        like); return what changed. Raises ``RunnerError`` ``trust-failed``."""
        return []

    def id_in_use(self, session_id: str, environ: Mapping[str, str]) -> bool:
        """Tell whether a fresh session under ``session_id`` would be refused as taken."""
        return False

    def check_args(self, harness_args: Sequence[str]) -> None:
        """Refuse operator flags this harness would exit on at once (``ConfigError``)."""
        return None

    def home_config(self, environ: Mapping[str, str]) -> list[Path]:
        """The harness's config under ``$HOME`` that a sandboxed session must be able to write."""
        home = Path(environ.get("HOME") or Path.home())
        return [home / part for part in self.home_paths]
