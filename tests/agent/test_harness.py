"""Harness argv builders: pure, table-driven; and the PATH look-up of the binary."""

from __future__ import annotations

from pathlib import Path

import pytest

from looprelay.agent import harness
from looprelay.errors import RunnerError

SID = "0b9d6f4e-3a53-4d7c-9a55-2f0f6f4b1c11"
FRESH = "9c1f0a9e-5b1e-4a52-8d0c-6c1f3b2a7e44"
FLAG_SHAPED = "--dangerously-skip-permissions"


class TestInteractiveArgv:
    @pytest.mark.parametrize(
        ("resume", "expected"),
        [
            (False, ["/bin/claude", "--session-id", SID, "--model", "opus"]),
            (True, ["/bin/claude", "--resume", SID, "--model", "opus"]),
        ],
    )
    def test_flags_only_the_prompt_is_pasted_later(self, resume: bool, expected: list[str]) -> None:
        argv = harness.interactive_argv(
            binary="/bin/claude",
            harness="claude",
            session_id=SID,
            resume=resume,
            extra=["--model", "opus"],
        )
        assert argv == expected

    @pytest.mark.parametrize(
        "session_id", [FLAG_SHAPED, "", SID.upper(), SID + "\n", "uuid-1", f"{SID} --x"]
    )
    def test_a_session_id_that_is_not_a_canonical_uuid_never_reaches_argv(
        self, session_id: str
    ) -> None:
        with pytest.raises(RunnerError) as caught:
            harness.interactive_argv(
                binary="claude", harness="claude", session_id=session_id, resume=True
            )
        assert caught.value.reason == "invalid-session-id"

    @pytest.mark.parametrize(
        ("resume", "expected"),
        [
            (False, ["/bin/codex", "-m", "o3"]),
            (True, ["/bin/codex", "resume", "--last", "-m", "o3"]),
        ],
    )
    def test_codex_names_its_own_conversations_and_resumes_the_trees_last(
        self, resume: bool, expected: list[str]
    ) -> None:
        argv = harness.interactive_argv(
            binary="/bin/codex", harness="codex", session_id=SID, resume=resume, extra=["-m", "o3"]
        )
        assert argv == expected

    def test_cursor_agent_cannot_be_hosted(self) -> None:
        with pytest.raises(RunnerError) as caught:
            harness.interactive_argv(
                binary="cursor-agent",
                harness="cursor-agent",
                session_id=SID,
                resume=False,
            )
        assert caught.value.reason == "harness-unsupported"


class TestHeadlessArgv:
    @pytest.mark.parametrize(
        ("name", "session_id", "resume", "expected"),
        [
            (
                "claude",
                SID,
                False,
                ["c", "-p", "--output-format", "json", "--session-id", SID, "-x"],
            ),
            (
                "claude",
                SID,
                True,
                ["c", "-p", "--output-format", "json", "--resume", SID, "-x"],
            ),
            ("cursor-agent", None, False, ["c", "-p", "--output-format", "json", "-x"]),
            (
                "cursor-agent",
                SID,
                True,
                ["c", "-p", "--output-format", "json", "--resume", SID, "-x"],
            ),
        ],
    )
    def test_one_turn(
        self, name: str, session_id: str | None, resume: bool, expected: list[str]
    ) -> None:
        argv = harness.headless_argv(
            binary="c",
            harness=name,
            session_id=session_id,
            resume=resume,
            extra=["-x"],
        )
        assert argv == expected

    @pytest.mark.parametrize(
        ("prompt", "expected"),
        [
            ("go", b"go"),
            ("--help me", b"--help me"),  # stdin is no option parser's: no space needed
            ("# Issue 15\nfix it", b"# Issue 15\nfix it"),
            ("a\x00b\ud800c", b"ab?c"),  # NUL dropped, a lone surrogate replaced
            ("é", "é".encode()),
            ("", b""),
        ],
    )
    def test_the_prompt_goes_on_stdin_as_utf8(self, prompt: str, expected: bytes) -> None:
        assert harness.prompt_input(prompt) == expected

    @pytest.mark.parametrize(
        ("name", "session_id", "resume"),
        [("claude", None, False), ("cursor-agent", None, True), ("claude", FLAG_SHAPED, True)],
    )
    def test_refuses_a_missing_or_invalid_id(
        self, name: str, session_id: str | None, resume: bool
    ) -> None:
        with pytest.raises(RunnerError) as caught:
            harness.headless_argv(binary="c", harness=name, session_id=session_id, resume=resume)
        assert caught.value.reason == "invalid-session-id"


class TestSessionChoice:
    @pytest.mark.parametrize(
        ("stored", "resume", "expected"),
        [
            (SID, True, (SID, "")),
            (SID, False, (SID, "")),
            (FLAG_SHAPED, True, (FRESH, "resume-failed")),
            (FLAG_SHAPED, False, (FRESH, "invalid-session-id")),
        ],
    )
    def test_usable_session_id(self, stored: str, resume: bool, expected: tuple[str, str]) -> None:
        assert harness.usable_session_id(stored, resume=resume, fresh=FRESH) == expected

    @pytest.mark.parametrize(
        ("name", "known", "offered", "resume", "expected"),
        [
            ("claude", SID, FLAG_SHAPED, False, (SID, True, "")),
            ("claude", None, SID, False, (SID, False, "")),
            ("claude", None, SID, True, (SID, True, "")),
            ("claude", None, FLAG_SHAPED, True, (FRESH, False, "resume-failed")),
            ("claude", FLAG_SHAPED, SID, False, (SID, False, "")),
            ("cursor-agent", None, SID, False, (None, False, "")),
            ("cursor-agent", None, SID, True, (SID, True, "")),
            ("cursor-agent", None, FLAG_SHAPED, True, (None, False, "resume-failed")),
        ],
    )
    def test_headless_session(
        self,
        name: str,
        known: str | None,
        offered: str,
        resume: bool,
        expected: tuple[str | None, bool, str],
    ) -> None:
        choice = harness.headless_session(
            name, known=known, offered=offered, resume=resume, fresh=FRESH
        )
        assert choice == expected


class TestResolveBinary:
    def test_finds_the_binary_on_path(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        binary = tmp_path / "claude"
        binary.write_text("#!/bin/sh\n")
        binary.chmod(0o755)
        monkeypatch.setenv("PATH", str(tmp_path))
        assert harness.resolve_binary("claude") == str(binary)

    def test_a_missing_binary_is_reported(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("PATH", str(tmp_path))
        with pytest.raises(RunnerError) as caught:
            harness.resolve_binary("claude")
        assert caught.value.reason == "harness-missing"

    def test_an_unknown_harness_is_unsupported(self) -> None:
        with pytest.raises(RunnerError) as caught:
            harness.resolve_binary("bash")
        assert caught.value.reason == "harness-unsupported"
