"""``looprelay session`` outside a session, or with its server gone: one line saying why, and
nothing posted. (Inside a session: tests/agent/test_session_comments.py.)"""

from __future__ import annotations

import os
import socket
import subprocess

from looprelay.wire.runner_api import SESSION_ENV
from tests.test_up import LOOPRELAY

SESSION_VARIABLES = tuple(SESSION_ENV.values())


def _run(*args: str, env: dict[str, str], stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*LOOPRELAY, "session", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def _outside() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in SESSION_VARIABLES}


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_outside_a_session_it_names_what_is_missing() -> None:
    result = _run("comment", "--body-file", "-", env=_outside(), stdin="hello")
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: LOOPRELAY_API_URL, LOOPRELAY_SESSION_TOKEN")
    assert "inside a session looprelay started" in line


def test_with_the_server_gone_it_says_nothing_was_posted() -> None:
    env = _outside() | {
        SESSION_ENV["api_url"]: f"http://127.0.0.1:{_closed_port()}",
        SESSION_ENV["token"]: "lrses_test",
        SESSION_ENV["work_item"]: "github:octo/repo#1",
        SESSION_ENV["endpoint"]: "github:octo/repo#1",
    }
    result = _run("ask", "--question", "Which one?", env=env)
    assert result.returncode == 1
    [line] = result.stderr.strip().splitlines()
    assert "could not be reached" in line and "nothing was posted" in line
    assert "Traceback" not in result.stderr


def test_ask_takes_exactly_one_question() -> None:
    result = _run("ask", env=_outside())
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: give exactly one of --question and --question-file"
    )
