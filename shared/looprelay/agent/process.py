"""The headless process runner: one harness turn as a child process, no shell, no terminal."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import tempfile
from pathlib import Path
from typing import IO, NamedTuple

from looprelay.errors import RunnerError

TAIL_BYTES = 4_096
"""How much of the end of stdout and of stderr a run keeps (the rest stays unread on disk)."""
KILL_WAIT_SECONDS = 5.0

_SESSION_ID_FIELD = re.compile(r'"session_id"\s*:\s*"([^"\\]{1,100})"')


class HeadlessRun(NamedTuple):
    """What one headless turn left: its exit code and the tails of its output."""

    exit_code: int
    stdout_tail: str
    stderr_tail: str


def run_headless(argv: list[str], *, cwd: Path, timeout_seconds: float) -> HeadlessRun:
    """Run ``argv`` in ``cwd`` with stdin empty and return its exit code and output tails.

    Output goes to unlinked temp files, so memory stays bounded by ``TAIL_BYTES`` whatever the
    harness prints. The child leads its own process group; after ``timeout_seconds`` the whole
    group is SIGKILLed (reaped within ``KILL_WAIT_SECONDS``). Raises ``RunnerError``:
    ``checkout-missing`` when ``cwd`` is not a directory, ``harness-missing`` when the binary
    cannot be started, ``harness-timeout`` when the turn outlives its timeout.
    """
    if not cwd.is_dir():
        raise RunnerError(f"{cwd} is not a directory", reason="checkout-missing")
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        try:
            child = subprocess.Popen(  # noqa: S603 - argv from harness.py, never a shell string
                argv,
                cwd=cwd,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
        except OSError as exc:
            raise RunnerError(
                f"cannot start {argv[0]}: {exc.strerror}", reason="harness-missing"
            ) from exc
        try:
            code = child.wait(timeout=timeout_seconds)
        except subprocess.TimeoutExpired as exc:
            _kill_group(child)
            raise RunnerError(
                f"{Path(argv[0]).name} ran past {timeout_seconds:g} s and was killed; "
                f"stderr: {_tail(err)[-500:]}",
                reason="harness-timeout",
            ) from exc
        return HeadlessRun(exit_code=code, stdout_tail=_tail(out), stderr_tail=_tail(err))


def session_id_from_output(stdout_tail: str) -> str | None:
    """Return the ``session_id`` a harness printed in its JSON result, if the tail holds one.

    Both claude and cursor-agent put ``session_id`` after ``result`` in their one JSON object,
    so the end of stdout is where it is; a tail that cut it off gives None.
    """
    found = _SESSION_ID_FIELD.findall(stdout_tail)
    return found[-1] if found else None


def _tail(handle: IO[bytes]) -> str:
    size = handle.seek(0, os.SEEK_END)
    handle.seek(max(0, size - TAIL_BYTES))
    return handle.read().decode("utf-8", "replace")


def _kill_group(child: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except ProcessLookupError:
        return
    child.wait(timeout=KILL_WAIT_SECONDS)
