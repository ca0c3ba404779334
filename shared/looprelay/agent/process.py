"""The headless process runner: one harness turn as a child process, no shell, no terminal."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from looprelay.agent.children import Overran, run_child
from looprelay.agent.harness import prompt_input
from looprelay.errors import RunnerError

STDOUT_TAIL_BYTES = 1024 * 1024
"""How much of the end of stdout a run keeps (the rest stays unread on disk): the harness's JSON
result is last, and an answer as long as a GitHub comment (65,536 characters, up to 4 bytes
each, more when JSON escapes them) must survive whole."""
STDERR_TAIL_BYTES = 4_096
"""How much of the end of stderr a run keeps: enough for the error it ends with."""


class HeadlessRun(NamedTuple):
    """What one headless turn left: its exit code and the tails of its output."""

    exit_code: int
    stdout_tail: str
    stderr_tail: str


def run_headless(
    argv: list[str],
    *,
    cwd: Path,
    prompt: str,
    timeout_seconds: float,
    env: Mapping[str, str] | None = None,
) -> HeadlessRun:
    """Run ``argv`` in ``cwd`` with ``prompt`` on stdin (never in argv: any user can read
    ``/proc/PID/cmdline``), its environment the agent's plus ``env``, and return its exit code
    and output tails.

    Memory stays bounded by ``STDOUT_TAIL_BYTES`` and ``STDERR_TAIL_BYTES`` whatever the
    harness prints (a result line longer than the stdout tail cannot be read); after
    ``timeout_seconds`` its whole process group is killed (``children.run_child``). Raises
    ``RunnerError``:
    ``checkout-missing`` when ``cwd`` is not a directory, ``harness-missing`` when the binary
    cannot be started, ``harness-timeout`` when the turn outlives its timeout.
    """
    if not cwd.is_dir():
        raise RunnerError(f"{cwd} is not a directory", reason="checkout-missing")
    try:
        run = run_child(
            argv,
            cwd=cwd,
            stdin=prompt_input(prompt),
            timeout_seconds=timeout_seconds,
            env=os.environ | dict(env) if env else None,
            stdout_limit=STDOUT_TAIL_BYTES,
            stderr_limit=STDERR_TAIL_BYTES,
        )
    except OSError as exc:
        raise RunnerError(
            f"cannot start {argv[0]}: {exc.strerror}", reason="harness-missing"
        ) from exc
    except Overran as exc:
        raise RunnerError(
            f"{Path(argv[0]).name} ran past {timeout_seconds:g} s and was killed; "
            f"stderr: {exc.stderr[-500:]}",
            reason="harness-timeout",
        ) from exc
    return HeadlessRun(exit_code=run.exit_code, stdout_tail=run.stdout, stderr_tail=run.stderr)
