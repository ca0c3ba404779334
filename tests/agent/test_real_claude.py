"""Smoke tests against the real, pinned Claude Code CLI (tests/claude_cli.py), offline.

They pin down what the runner relies on: a spawn prompt and a paste reach the session's
transcript with its cwd and session id, an untrusted folder stops at the trust dialog, a
headless turn without a login is an error result, an id in use is refused and ``--resume``
continues the same transcript. The binary answers "Not logged in"; its transcript, not its
answer, is the oracle.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

from looprelay.agent.tmux import TmuxTerminal
from tests.agent.conftest import SESSION
from tests.claude_cli import (
    DEADLINE_SECONDS,
    ClaudeHome,
    UserMessage,
    read_user_messages,
    screen,
    wait_for_message,
)
from tests.fake_harness import wait_until

PROMPT = "Work on github:octo/repo#15"
NOT_LOGGED_IN = "Not logged in · Please run /login"


def _work_dir(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    return work


def _spawn_and_wait(
    terminal: TmuxTerminal, claude_home: ClaudeHome, work: Path, session_id: str
) -> UserMessage:
    terminal.spawn(SESSION, cwd=work, argv=claude_home.command("--session-id", session_id, PROMPT))
    return wait_for_message(
        claude_home.home,
        lambda message: message.session_id == session_id,
        explain=lambda: screen(terminal, SESSION),
    )


class TestSession:
    def test_a_spawn_prompt_reaches_the_transcript_with_its_cwd_and_session_id(
        self, terminal: TmuxTerminal, claude_home: ClaudeHome, tmp_path: Path
    ) -> None:
        work = _work_dir(tmp_path)
        claude_home.trust(work)
        session_id = str(uuid.uuid4())
        message = _spawn_and_wait(terminal, claude_home, work, session_id)
        assert message == UserMessage(cwd=str(work.resolve()), session_id=session_id, text=PROMPT)

    def test_a_paste_reaches_the_same_session(
        self, terminal: TmuxTerminal, claude_home: ClaudeHome, tmp_path: Path
    ) -> None:
        work = _work_dir(tmp_path)
        claude_home.trust(work)
        session_id = str(uuid.uuid4())
        _spawn_and_wait(terminal, claude_home, work, session_id)
        comment = "A later comment\nwith a second line; $(not run) `id`"
        terminal.paste(SESSION, comment)
        message = wait_for_message(
            claude_home.home,
            lambda message: message.text == comment,
            explain=lambda: screen(terminal, SESSION),
        )
        assert (message.cwd, message.session_id) == (str(work.resolve()), session_id)

    def test_an_untrusted_folder_stops_at_the_trust_dialog_before_the_prompt(
        self, terminal: TmuxTerminal, claude_home: ClaudeHome, tmp_path: Path
    ) -> None:
        work = _work_dir(tmp_path)
        terminal.spawn(
            SESSION, cwd=work, argv=claude_home.command("--session-id", str(uuid.uuid4()), PROMPT)
        )
        wait_until(
            lambda: "Yes, I trust this folder" in screen(terminal, SESSION),
            seconds=DEADLINE_SECONDS,
            what="Claude's trust dialog",
            explain=lambda: screen(terminal, SESSION),
        )
        assert read_user_messages(claude_home.home) == []


class TestHeadless:
    def _turn(
        self, claude_home: ClaudeHome, work: Path, *args: str
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(claude_home.claude), "-p", "--output-format", "json", *args],
            cwd=work,
            env=claude_home.environ(),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=DEADLINE_SECONDS,
            check=False,
        )

    def test_a_turn_without_a_login_is_an_error_result_that_exits_1(
        self, claude_home: ClaudeHome, tmp_path: Path
    ) -> None:
        work, session_id = _work_dir(tmp_path), str(uuid.uuid4())
        turn = self._turn(claude_home, work, "--session-id", session_id, PROMPT)
        assert turn.returncode == 1, turn.stderr
        result = json.loads(turn.stdout)
        assert (result["type"], result["is_error"], result["result"]) == (
            "result",
            True,
            NOT_LOGGED_IN,
        )
        assert result["session_id"] == session_id
        # Headless turns skip the trust dialog, and still record the prompt.
        assert read_user_messages(claude_home.home) == [
            UserMessage(cwd=str(work.resolve()), session_id=session_id, text=PROMPT)
        ]

    def test_a_session_id_in_use_in_that_folder_is_refused(
        self, claude_home: ClaudeHome, tmp_path: Path
    ) -> None:
        work, session_id = _work_dir(tmp_path), str(uuid.uuid4())
        self._turn(claude_home, work, "--session-id", session_id, PROMPT)
        again = self._turn(claude_home, work, "--session-id", session_id, PROMPT)
        assert again.returncode == 1
        assert again.stdout == ""
        assert again.stderr.strip() == f"Error: Session ID {session_id} is already in use."

    def test_resume_continues_the_same_transcript(
        self, claude_home: ClaudeHome, tmp_path: Path
    ) -> None:
        work, session_id = _work_dir(tmp_path), str(uuid.uuid4())
        self._turn(claude_home, work, "--session-id", session_id, PROMPT)
        resumed = self._turn(claude_home, work, "--resume", session_id, "and again")
        assert json.loads(resumed.stdout)["session_id"] == session_id
        transcripts = list((claude_home.home / ".claude" / "projects").glob("*/*.jsonl"))
        assert [t.name for t in transcripts] == [f"{session_id}.jsonl"]
        assert [m.text for m in read_user_messages(claude_home.home)] == [PROMPT, "and again"]
