"""One child program run to its end or its deadline: an argv list, no shell, no terminal.

Both git and a headless harness turn run this way. Input (a headless turn's prompt, which never
goes into argv: /proc/PID/cmdline is world-readable) and output go through unlinked temp files
(0600, gone from the file system before the child starts), so a
grandchild that keeps them open (ssh, a remote helper) cannot make the wait hang, and memory
stays bounded by the tails kept. The child leads its own process group, so a deadline kills
everything it started.
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, NamedTuple

KILL_WAIT_SECONDS = 5.0
"""How long a SIGKILLed process group may take to be reaped."""


class Finished(NamedTuple):
    """What a child left: its exit code and (the kept tails of) its output."""

    exit_code: int
    stdout: str
    stderr: str


class Overran(Exception):
    """The child ran past its deadline and was killed; ``stderr`` is what it had said."""

    def __init__(self, stderr: str) -> None:
        super().__init__("ran past its deadline")
        self.stderr = stderr


def run_child(
    argv: Sequence[str],
    *,
    cwd: Path | None,
    timeout_seconds: float,
    env: Mapping[str, str] | None = None,
    stdin: bytes = b"",
    stdout_limit: int | None = None,
    stderr_limit: int | None = None,
    errors: str = "replace",
) -> Finished:
    """Run ``argv`` in ``cwd`` until it exits or ``timeout_seconds`` pass; it reads ``stdin``
    (empty by default) from a private unlinked file, so no other user can read it.

    Keeps the last ``stdout_limit``/``stderr_limit`` bytes of each stream (None: all of it),
    decoded as UTF-8 with ``errors`` (``surrogateescape`` keeps the bytes). Raises ``OSError``
    when the program cannot be started and :class:`Overran` when it outlives the timeout (its
    whole group is SIGKILLed first).
    """
    with (
        tempfile.TemporaryFile() as given,
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
    ):
        given.write(stdin)
        given.seek(0)
        child = subprocess.Popen(  # noqa: S603 - an argv list from this package, never a shell
            list(argv),
            cwd=cwd,
            env=None if env is None else dict(env),
            stdin=given if stdin else subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
        try:
            code = child.wait(timeout=timeout_seconds)
        except subprocess.TimeoutExpired:
            _kill_group(child)
            raise Overran(_tail(err, stderr_limit)) from None
        return Finished(code, _tail(out, stdout_limit, errors), _tail(err, stderr_limit, errors))


def _tail(handle: IO[bytes], limit: int | None, errors: str = "replace") -> str:
    size = handle.seek(0, os.SEEK_END)
    handle.seek(0 if limit is None else max(0, size - limit))
    return handle.read().decode("utf-8", errors)


def _kill_group(child: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    child.wait(timeout=KILL_WAIT_SECONDS)
