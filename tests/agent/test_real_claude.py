"""Smoke tests against the real, pinned Claude Code CLI (tests/claude_cli.py), offline.

They pin down what the runner relies on: a boot prompt pasted right after the spawn (never in
argv) and a later paste reach the session's transcript with its cwd and session id, an
untrusted folder stops at the trust dialog (the boot paste answers nothing), a headless turn
(its prompt on stdin) without a login is an error result, an id in use is refused and
``--resume`` continues the same transcript. The binary answers "Not logged in"; its transcript,
not its answer, is the oracle.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest

from looprelay.agent.hosted import look
from looprelay.agent.tmux import TmuxTerminal
from tests.agent.conftest import SESSION, Rig, make_dispatch
from tests.claude_cli import (
    DEADLINE_SECONDS,
    ClaudeHome,
    UserMessage,
    read_user_messages,
    screen,
    wait_for_message,
)
from tests.fake_harness import cmdlines_holding, wait_until

pytestmark = pytest.mark.real_cli  # run apart from the parallel workers

PROMPT = "Work on github:octo/repo#15"
NOT_LOGGED_IN = "Not logged in · Please run /login"


def _work_dir(tmp_path: Path) -> Path:
    work = tmp_path / "work"
    work.mkdir()
    return work


def _spawn_and_wait(
    terminal: TmuxTerminal, claude_home: ClaudeHome, work: Path, session_id: str
) -> UserMessage:
    """Spawn Claude as the applier does: no prompt in argv, the boot prompt pasted at once."""
    terminal.spawn(SESSION, cwd=work, argv=claude_home.command("--session-id", session_id))
    terminal.paste(SESSION, PROMPT)
    message = wait_for_message(
        claude_home.home,
        lambda message: message.session_id == session_id,
        explain=lambda: screen(terminal, SESSION),
    )
    assert cmdlines_holding(PROMPT) == {}  # Claude runs, and no command line holds the prompt
    return message


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

    def test_an_untrusted_folder_stops_at_the_trust_dialog_and_the_boot_paste_answers_nothing(
        self, terminal: TmuxTerminal, claude_home: ClaudeHome, tmp_path: Path
    ) -> None:
        work = _work_dir(tmp_path)
        terminal.spawn(
            SESSION, cwd=work, argv=claude_home.command("--session-id", str(uuid.uuid4()))
        )
        terminal.paste(SESSION, PROMPT)  # waits for the first screen: the dialog
        wait_until(
            lambda: "Yes, I trust this folder" in screen(terminal, SESSION),
            seconds=DEADLINE_SECONDS,
            what="Claude's trust dialog",
            explain=lambda: screen(terminal, SESSION),
        )
        assert read_user_messages(claude_home.home) == []
        config = json.loads(claude_home.config_path.read_text(encoding="utf-8"))
        assert str(work.resolve()) not in config.get("projects", {})  # the Enter trusted nothing
        assert terminal.pane_dead(SESSION) is False


class TestHeadless:
    def _turn(
        self, claude_home: ClaudeHome, work: Path, *args: str, prompt: str = PROMPT
    ) -> subprocess.CompletedProcess[str]:
        """One turn as the applier runs it: the prompt on stdin, never in argv."""
        return subprocess.run(
            [str(claude_home.claude), "-p", "--output-format", "json", *args],
            cwd=work,
            env=claude_home.environ(),
            input=prompt,
            capture_output=True,
            text=True,
            timeout=DEADLINE_SECONDS,
            check=False,
        )

    def test_a_turn_without_a_login_is_an_error_result_that_exits_1(
        self, claude_home: ClaudeHome, tmp_path: Path
    ) -> None:
        work, session_id = _work_dir(tmp_path), str(uuid.uuid4())
        turn = self._turn(claude_home, work, "--session-id", session_id)
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
        self._turn(claude_home, work, "--session-id", session_id)
        again = self._turn(claude_home, work, "--session-id", session_id)
        assert again.returncode == 1
        assert again.stdout == ""
        assert again.stderr.strip() == f"Error: Session ID {session_id} is already in use."

    def test_resume_continues_the_same_transcript(
        self, claude_home: ClaudeHome, tmp_path: Path
    ) -> None:
        work, session_id = _work_dir(tmp_path), str(uuid.uuid4())
        self._turn(claude_home, work, "--session-id", session_id)
        resumed = self._turn(claude_home, work, "--resume", session_id, prompt="and again")
        assert json.loads(resumed.stdout)["session_id"] == session_id
        transcripts = list((claude_home.home / ".claude" / "projects").glob("*/*.jsonl"))
        assert [t.name for t in transcripts] == [f"{session_id}.jsonl"]
        assert [m.text for m in read_user_messages(claude_home.home)] == [PROMPT, "and again"]


class TestNeverOnboarded:
    def test_a_claude_never_onboarded_fails_its_spawn_in_its_own_words_and_is_reported_exited(
        self, rig: Rig, claude_home: ClaudeHome, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Issue 23: such a Claude dies about a second after it starts. The spawn is
        ``harness-failed`` with its screen as the detail and a note for the work item, never
        ``spawned``; the next heartbeat names the session exited."""
        claude_home.config_path.write_text("{}", encoding="utf-8")  # never onboarded
        for name in claude_home.unset:
            monkeypatch.delenv(name, raising=False)
        for name, value in claude_home.env.items():
            monkeypatch.setenv(name, value)  # what the agent, and so its tmux session, gets
        rig.applier.spawn_probe_seconds = 3.0
        result = rig.applier.apply(make_dispatch())
        assert (result.status, result.reason) == ("failed", "harness-failed"), result
        assert "Unable to connect to Anthropic services" in result.detail
        assert result.reply.startswith("😕 claude session did not start: `")
        assert "Unable to connect to Anthropic services" in result.reply
        [hosted] = look(rig.terminal, rig.ledger.all_sessions(), in_hand=())
        assert hosted.harness == "exited"
        assert "Unable to connect to Anthropic services" in hosted.last_lines
        assert hosted.shown().startswith("exited (")
