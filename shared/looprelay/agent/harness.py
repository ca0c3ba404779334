"""A harness's binary on PATH, its argv and its session ids, whichever harness it is.

The harness itself is a module of ``agent/harnesses`` (one interface); this module looks it up
by the name a dispatch carries. No prompt ever goes into argv: any user on the machine can read
``/proc/PID/cmdline``. A hosted harness gets its boot prompt as one bracketed paste
(``TmuxTerminal.paste``), a headless turn reads it from stdin (:func:`prompt_input`). A session
id that is not a canonical UUID never reaches argv: the builders refuse it, and the applier
swaps in a fresh one.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence

from looprelay.agent import harnesses
from looprelay.agent.harnesses.base import is_session_id
from looprelay.errors import RunnerError

CLAUDE = harnesses.CLAUDE.name
CURSOR_AGENT = harnesses.CURSOR_AGENT.name
HARNESSES = harnesses.NAMES
INTERACTIVE_HARNESSES = tuple(name for name, h in harnesses.REGISTRY.items() if h.hostable)
"""Harnesses that can live in a tmux pane."""

__all__ = ["is_session_id"]


def resolve_binary(harness: str) -> str:
    """Return the absolute path of ``harness``'s binary, found on ``PATH``.

    The absolute path goes into argv so the tmux server's own ``PATH`` cannot pick another one.
    Raises ``RunnerError`` ``harness-unsupported`` for an unknown harness and ``harness-missing``
    when the binary is not on ``PATH`` (install it, or fix the agent's ``PATH``).
    """
    binary = harnesses.get(harness).binary
    found = shutil.which(binary)
    if found is None:
        raise RunnerError(
            f"{binary} is not on this runner's PATH; install it or fix PATH for the agent",
            reason="harness-missing",
        )
    return os.path.abspath(found)


def interactive_argv(
    *,
    binary: str,
    harness: str,
    session_id: str,
    resume: bool,
    extra: Sequence[str] = (),
) -> list[str]:
    """Return the argv of a harness hosted in tmux, which never holds the prompt.

    Raises ``RunnerError`` ``harness-unsupported`` for a harness that cannot be hosted and
    ``invalid-session-id`` for an id that is not a canonical UUID.
    """
    found = harnesses.get(harness)
    return found.hosted_argv(binary, session_id=session_id, resume=resume, extra=extra)


def headless_argv(
    *,
    binary: str,
    harness: str,
    session_id: str | None,
    resume: bool,
    extra: Sequence[str] = (),
) -> list[str]:
    """Return the argv of one headless turn, which reads its prompt from stdin.

    ``session_id`` may be None only on a first turn of a harness that picks its own id.
    Raises ``RunnerError`` ``harness-unsupported`` for an unknown harness and
    ``invalid-session-id`` for an id that is not a canonical UUID or a missing one it needs.
    """
    found = harnesses.get(harness)
    return found.headless_argv(binary, session_id=session_id, resume=resume, extra=extra)


def prompt_input(prompt: str) -> bytes:
    """Return ``prompt`` as the bytes a headless turn reads on stdin: UTF-8, a lone surrogate
    (valid in JSON, not encodable) replaced and NUL dropped (a harness reads text). Never raises."""
    return prompt.replace("\x00", "").encode("utf-8", "replace")


def usable_session_id(stored: str, *, resume: bool, fresh: str) -> tuple[str, str]:
    """Return the id to start with and why it was replaced (empty when ``stored`` is usable).

    An id that is not a canonical UUID never reaches argv; ``fresh`` replaces it, with
    reason ``resume-failed`` when a resume was asked for, else ``invalid-session-id``.
    """
    if is_session_id(stored):
        return stored, ""
    return fresh, "resume-failed" if resume else "invalid-session-id"


def headless_session(
    harness: str, *, known: str | None, offered: str, resume: bool, fresh: str
) -> tuple[str | None, bool, str]:
    """Choose ``(session_id, resume, reason)`` for a headless turn.

    ``known`` is the id an earlier turn on this runner used: later turns resume it. Otherwise
    a harness that takes ids starts (or, with ``resume``, resumes) ``offered``, replaced by
    ``fresh`` when it is not a UUID; one that picks its own id does so on a first turn (None).
    """
    if known is not None and is_session_id(known):
        return known, True, ""
    if harnesses.get(harness).takes_session_id or (resume and is_session_id(offered)):
        session_id, reason = usable_session_id(offered, resume=resume, fresh=fresh)
        return session_id, resume and not reason, reason
    return None, False, "resume-failed" if resume else ""
