"""Each harness's argv, as pure functions, and its binary on PATH.

Claude (``claude``) is hosted in tmux or run headless; ``cursor-agent`` only runs headless, because
it cannot be hosted in a terminal the agent pastes into. No prompt ever goes into argv: any
user on the machine can read ``/proc/PID/cmdline``. A hosted harness gets its boot prompt as one
bracketed paste (``TmuxTerminal.paste``), a headless turn reads it from stdin (a private unlinked
file, :func:`prompt_input`): ``claude -p`` and ``cursor-agent -p`` both read their prompt from
stdin when argv has none. A session id that is not a canonical UUID never reaches argv: the
builders refuse it, and the applier swaps in a fresh one.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Sequence

from looprelay.errors import RunnerError

CLAUDE = "claude"
CURSOR_AGENT = "cursor-agent"
HARNESSES = (CLAUDE, CURSOR_AGENT)
INTERACTIVE_HARNESSES = (CLAUDE,)
"""Harnesses that can live in a tmux pane (cursor cannot be hosted)."""

_SESSION_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def is_session_id(value: str) -> bool:
    """Tell whether ``value`` is a canonical lower-case UUID, the only id argv may carry."""
    return _SESSION_ID.fullmatch(value) is not None


def resolve_binary(harness: str) -> str:
    """Return the absolute path of ``harness``'s binary, found on ``PATH``.

    The absolute path goes into argv so the tmux server's own ``PATH`` cannot pick another one.
    Raises ``RunnerError`` ``harness-unsupported`` for an unknown harness and ``harness-missing``
    when the binary is not on ``PATH`` (install it, or fix the agent's ``PATH``).
    """
    if harness not in HARNESSES:
        raise RunnerError(
            f"harness {harness[:40]!r} is not one of {', '.join(HARNESSES)}",
            reason="harness-unsupported",
        )
    found = shutil.which(harness)
    if found is None:
        raise RunnerError(
            f"{harness} is not on this runner's PATH; install it or fix PATH for the agent",
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

    Spawn: ``claude --session-id <uuid> [extra]``; resume: ``claude --resume <uuid> [extra]``;
    the boot prompt is pasted once the harness is up. Raises ``RunnerError``
    ``harness-unsupported`` for a harness that cannot be hosted (cursor-agent) and
    ``invalid-session-id`` for an id that is not a canonical UUID.
    """
    if harness not in INTERACTIVE_HARNESSES:
        raise RunnerError(
            f"{harness[:40]} cannot be hosted in tmux; use runner kind 'process' for it",
            reason="harness-unsupported",
        )
    _check_session_id(session_id)
    flag = "--resume" if resume else "--session-id"
    return [binary, flag, session_id, *extra]


def headless_argv(
    *,
    binary: str,
    harness: str,
    session_id: str | None,
    resume: bool,
    extra: Sequence[str] = (),
) -> list[str]:
    """Return the argv of one headless turn, which reads its prompt from stdin.

    ``claude -p --output-format json (--session-id|--resume) <uuid> [extra]``;
    ``cursor-agent -p --output-format json [--resume <id>] [extra]`` (cursor-agent picks its own
    id on a first turn, so ``session_id`` may be None there; ``-p`` is a boolean flag in both
    CLIs, so with no positional prompt each reads stdin; see :func:`prompt_input`). Raises
    ``RunnerError`` ``harness-unsupported`` for an unknown harness and ``invalid-session-id``
    for an id that is not a canonical UUID or a missing id Claude needs.
    """
    if harness not in HARNESSES:
        raise RunnerError(f"unknown harness {harness[:40]!r}", reason="harness-unsupported")
    argv = [binary, "-p", "--output-format", "json"]
    if session_id is None:
        if harness == CLAUDE or resume:
            raise RunnerError("a headless turn needs a session id", reason="invalid-session-id")
    else:
        _check_session_id(session_id)
        if resume:
            argv += ["--resume", session_id]
        elif harness == CLAUDE:
            argv += ["--session-id", session_id]
    return [*argv, *extra]


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
    Claude starts (or, with ``resume``, resumes) ``offered``, replaced by ``fresh`` when it is
    not a UUID; cursor-agent picks its own id on a first turn (None).
    """
    if known is not None and is_session_id(known):
        return known, True, ""
    if harness == CLAUDE or (resume and is_session_id(offered)):
        session_id, reason = usable_session_id(offered, resume=resume, fresh=fresh)
        return session_id, resume and not reason, reason
    return None, False, "resume-failed" if resume else ""


def _check_session_id(session_id: str) -> None:
    if not is_session_id(session_id):
        raise RunnerError(
            "the session id is not a canonical UUID and never goes into argv",
            reason="invalid-session-id",
        )
