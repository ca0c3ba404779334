"""TmuxTerminal against real tmux on a throwaway socket, with the fake harness in the pane."""

from __future__ import annotations

import os
import pty
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

from looprelay.agent.tmux import TmuxTerminal
from looprelay.errors import RunnerError
from tests.agent.conftest import SESSION_ID
from tests.fake_harness import FakeHarness, cmdlines_holding, wait_until

PASTE_START, PASTE_END = "\x1b[200~", "\x1b[201~"


def _spawn(terminal: TmuxTerminal, fake: FakeHarness, cwd: Path, *, name: str = "loop-t1") -> int:
    terminal.spawn(name, cwd=cwd, argv=[fake.claude, "--session-id", SESSION_ID])
    return int(fake.wait_ready()[-1]["pid"])


class TestSpawn:
    def test_argv_and_cwd_reach_the_harness_verbatim(
        self, terminal: TmuxTerminal, fake_harness: FakeHarness, tmp_path: Path
    ) -> None:
        cwd = tmp_path / "check#{pane_id}out"
        cwd.mkdir()
        odd = "# Issue\n$(touch pwned) `id` ~ #{pane_id} 'q' \"dq\" a;b ends with;"
        argv = [fake_harness.claude, "--session-id", SESSION_ID, "x\\;", odd]
        terminal.spawn("loop-t1", cwd=cwd, argv=argv)
        (start,) = fake_harness.wait_ready()
        assert start["argv"] == argv[1:]
        assert start["cwd"] == str(cwd)
        assert not (cwd / "pwned").exists()

    def test_each_session_starts_with_the_agents_environment_of_now_not_the_servers(
        self,
        terminal: TmuxTerminal,
        fake_harness: FakeHarness,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        monkeypatch.setenv("LOOPRELAY_TEST_KEY", "first-value")
        monkeypatch.setenv("LOOPRELAY_TEST_GONE", "was set")
        _spawn(terminal, fake_harness, tmp_path, name="loop-first")  # starts the server
        monkeypatch.setenv("LOOPRELAY_TEST_KEY", "second-value")
        monkeypatch.delenv("LOOPRELAY_TEST_GONE")
        monkeypatch.setenv("LOOPRELAY_TEST_NEW", "new")
        terminal.spawn("loop-second", cwd=tmp_path, argv=[fake_harness.claude])
        first, second = fake_harness.wait_ready(2)
        assert first["env"]["LOOPRELAY_TEST_KEY"] == "first-value"
        assert second["env"]["LOOPRELAY_TEST_KEY"] == "second-value"
        assert second["env"]["LOOPRELAY_TEST_NEW"] == "new"
        assert "LOOPRELAY_TEST_GONE" not in second["env"]
        assert second["env"]["TMUX_PANE"] != first["env"]["TMUX_PANE"]  # tmux's own, per pane
        assert not cmdlines_holding("second-value")  # names on command lines, never values

    def test_a_variable_the_harness_must_not_inherit_is_cleared_for_its_session_only(
        self,
        terminal: TmuxTerminal,
        fake_harness: FakeHarness,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        monkeypatch.setenv("CI", "true")  # the agent runs in a CI job; the server starts with it
        trees = {name: tmp_path / name for name in ("loop-first", "loop-second")}
        for tree in trees.values():
            tree.mkdir()
        argv = [fake_harness.claude]
        terminal.spawn("loop-first", cwd=trees["loop-first"], argv=argv, unset=("CI",))
        terminal.spawn("loop-second", cwd=trees["loop-second"], argv=argv)
        by_tree = {Path(start["cwd"]).name: start for start in fake_harness.wait_ready(2)}
        assert "CI" not in by_tree["loop-first"]["env"]
        assert by_tree["loop-second"]["env"]["CI"] == "true"
        assert os.environ["CI"] == "true", "the agent's own environment is left as it was"

    def test_a_sessions_own_variables_reach_only_it_never_a_command_line(
        self, terminal: TmuxTerminal, fake_harness: FakeHarness, tmp_path: Path
    ) -> None:
        token = {"LOOPRELAY_SESSION_TOKEN": "lrses_first-session-only"}
        trees = {name: tmp_path / name for name in ("loop-first", "loop-second")}
        for tree in trees.values():
            tree.mkdir()
        # The first spawn starts the server, which takes its client's environment.
        terminal.spawn("loop-first", cwd=trees["loop-first"], argv=[fake_harness.claude], env=token)
        assert not cmdlines_holding("lrses_first-session-only")
        terminal.spawn("loop-second", cwd=trees["loop-second"], argv=[fake_harness.claude])
        by_tree = {Path(start["cwd"]).name: start for start in fake_harness.wait_ready(2)}
        first, second = by_tree["loop-first"], by_tree["loop-second"]
        assert first["env"]["LOOPRELAY_SESSION_TOKEN"] == "lrses_first-session-only"
        assert "LOOPRELAY_SESSION_TOKEN" not in second["env"]
        listed = subprocess.run(
            ["tmux", "-L", terminal.socket_name, "show-environment", "-g"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert "lrses_first-session-only" not in listed.stdout

    def test_a_boot_prompt_too_long_for_a_tmux_command_is_pasted_whole_from_no_file_left(
        self,
        terminal: TmuxTerminal,
        fake_harness: FakeHarness,
        tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch,
    ) -> None:
        private_tmp = tmp_path / "tmp"
        private_tmp.mkdir()
        monkeypatch.setattr(tempfile, "tempdir", str(private_tmp))
        prompt = "é" * 30_000 + " ends;"  # 60 KB of UTF-8: tmux refuses a ~16 KB command
        terminal.spawn("loop-t1", cwd=tmp_path, argv=[fake_harness.claude, "--resume", SESSION_ID])
        terminal.paste("loop-t1", prompt)
        (start,) = fake_harness.wait_ready()
        assert start["argv"] == ["--resume", SESSION_ID]
        wait_until(
            lambda: fake_harness.received(start["pid"]) == f"{PASTE_START}{prompt}{PASTE_END}\r"
        )
        assert list(private_tmp.iterdir()) == []

    def test_a_missing_directory_is_refused_before_tmux(
        self, terminal: TmuxTerminal, fake_harness: FakeHarness, tmp_path: Path
    ) -> None:
        with pytest.raises(RunnerError) as caught:
            terminal.spawn("loop-t1", cwd=tmp_path / "nope", argv=[fake_harness.claude])
        assert caught.value.reason == "checkout-missing"

    def test_a_duplicate_session_is_a_tmux_failure(
        self, terminal: TmuxTerminal, fake_harness: FakeHarness, tmp_path: Path
    ) -> None:
        _spawn(terminal, fake_harness, tmp_path)
        with pytest.raises(RunnerError) as caught:
            terminal.spawn("loop-t1", cwd=tmp_path, argv=[fake_harness.claude])
        assert caught.value.reason == "tmux-failed"

    @pytest.mark.parametrize("name", ["other", "loop-a.b", "loop-a:1", "loop-", "-loop-a"])
    def test_only_loop_session_names_are_touched(self, terminal: TmuxTerminal, name: str) -> None:
        with pytest.raises(RunnerError) as caught:
            terminal.pane_dead(name)
        assert caught.value.reason == "invalid-session-name"


class TestState:
    def test_missing_live_and_dead_panes(
        self, terminal: TmuxTerminal, fake_harness: FakeHarness, tmp_path: Path
    ) -> None:
        assert terminal.pane_dead("loop-t1") is None  # no server at all yet
        _spawn(terminal, fake_harness, tmp_path)
        assert terminal.pane_dead("loop-t1") is False
        assert terminal.has_session("loop-t1")
        assert terminal.pane_dead("loop-t") is None  # exact names, never a prefix match
        fake_harness.mark("exit-once")
        terminal.spawn("loop-t2", cwd=tmp_path, argv=[fake_harness.claude])
        assert wait_until(lambda: terminal.pane_dead("loop-t2"))  # remain-on-exit kept it
        assert terminal.has_session("loop-t2")

    def test_kill_is_idempotent_and_attach_names_the_socket(
        self, terminal: TmuxTerminal, fake_harness: FakeHarness, tmp_path: Path
    ) -> None:
        _spawn(terminal, fake_harness, tmp_path)
        terminal.kill("loop-t1")
        terminal.kill("loop-t1")
        assert terminal.pane_dead("loop-t1") is None
        socket = terminal.socket_name
        assert terminal.attach_command("loop-t1") == f"tmux -L {socket} attach -t loop-t1"
        assert terminal.attach_command("loop-t1", read_only=True).endswith("attach -r -t loop-t1")


class TestPaste:
    def test_a_multi_line_prompt_arrives_once_as_one_bracketed_paste_then_enter(
        self, terminal: TmuxTerminal, fake_harness: FakeHarness, tmp_path: Path
    ) -> None:
        pid = _spawn(terminal, fake_harness, tmp_path)
        text = "# New comment\n\nline two;\n\tindented $(not run)\n- a list item"
        terminal.paste("loop-t1", text)
        expected = PASTE_START + text.replace("\n", "\r") + PASTE_END + "\r"
        wait_until(lambda: fake_harness.received(pid) == expected)
        time.sleep(0.1)
        assert fake_harness.received(pid) == expected
        assert len(fake_harness.starts()) == 1

    def test_a_paste_right_after_a_spawn_waits_for_the_first_screen(
        self, terminal: TmuxTerminal, fake_harness: FakeHarness, tmp_path: Path
    ) -> None:
        # Claude goes raw before it draws and drops input that came in between; a paste sent
        # in that gap used to sit in its input box without the Enter (seen with the real CLI).
        fake_harness.mark("draw-late")
        argv = [fake_harness.claude, "--session-id", SESSION_ID, "boot"]
        terminal.spawn("loop-t1", cwd=tmp_path, argv=argv)
        terminal.paste("loop-t1", "the first comment")  # no wait for the fake to be ready
        [start] = fake_harness.starts()
        expected = PASTE_START + "the first comment" + PASTE_END + "\r"
        wait_until(lambda: fake_harness.received(start["pid"]) == expected)

    def test_control_characters_cannot_close_the_bracket(
        self, terminal: TmuxTerminal, fake_harness: FakeHarness, tmp_path: Path
    ) -> None:
        pid = _spawn(terminal, fake_harness, tmp_path)
        terminal.paste("loop-t1", "a\x1b[201~\x03b\r\nc\rd\x07")
        expected = PASTE_START + "a[201~b\rc\rd" + PASTE_END + "\r"
        wait_until(lambda: fake_harness.received(pid) == expected)

    def test_submit_works_with_a_read_only_client_attached(
        self, terminal: TmuxTerminal, fake_harness: FakeHarness, tmp_path: Path
    ) -> None:
        pid = _spawn(terminal, fake_harness, tmp_path)
        leader, follower = pty.openpty()
        attach = terminal.attach_command("loop-t1", read_only=True).split()
        client = subprocess.Popen(
            attach,
            stdin=follower,
            stdout=follower,
            stderr=follower,
            env={**os.environ, "TERM": "xterm"},
        )
        try:
            wait_until(lambda: _clients(terminal) >= 1)
            terminal.paste("loop-t1", "hello")
            wait_until(
                lambda: fake_harness.received(pid) == PASTE_START + "hello" + PASTE_END + "\r"
            )
        finally:
            client.kill()
            client.wait()
            os.close(leader)
            os.close(follower)

    def test_pasting_into_a_missing_session_fails(self, terminal: TmuxTerminal) -> None:
        with pytest.raises(RunnerError) as caught:
            terminal.paste("loop-t1", "hello")
        assert caught.value.reason == "session-missing"


class TestTerminate:
    def test_sigterm_ends_the_harness_and_keeps_the_session(
        self, terminal: TmuxTerminal, fake_harness: FakeHarness, tmp_path: Path
    ) -> None:
        _spawn(terminal, fake_harness, tmp_path)
        assert terminal.terminate_harness("loop-t1", 5.0) == "terminated"
        assert terminal.pane_dead("loop-t1") is True
        assert terminal.terminate_harness("loop-t1", 5.0) == "already-dead"

    def test_a_harness_ignoring_sigterm_is_killed_after_the_grace(
        self, terminal: TmuxTerminal, fake_harness: FakeHarness, tmp_path: Path
    ) -> None:
        fake_harness.mark("ignore-term")
        _spawn(terminal, fake_harness, tmp_path)
        started = time.monotonic()
        assert terminal.terminate_harness("loop-t1", 0.3) == "killed"
        assert time.monotonic() - started >= 0.3
        assert terminal.pane_dead("loop-t1") is True

    def test_a_missing_session_is_absent(self, terminal: TmuxTerminal) -> None:
        assert terminal.terminate_harness("loop-t1", 0.3) == "absent"


def _clients(terminal: TmuxTerminal) -> int:
    listed = subprocess.run(
        ["tmux", "-L", terminal.socket_name, "list-clients"],
        capture_output=True,
        text=True,
        check=False,
    )
    return len(listed.stdout.splitlines())


class TestWedgedServer:
    def test_a_server_that_stops_answering_fails_the_call_in_time_with_its_reason(
        self, terminal: TmuxTerminal, fake_harness: FakeHarness, tmp_path: Path
    ) -> None:
        _spawn(terminal, fake_harness, tmp_path)
        impatient = TmuxTerminal(terminal.socket_name, command_timeout_seconds=1.0)
        server_pid = int(
            subprocess.run(
                ["tmux", "-L", terminal.socket_name, "display-message", "-p", "#{pid}"],
                capture_output=True,
                text=True,
                check=True,
                timeout=10,
            ).stdout
        )
        os.kill(server_pid, signal.SIGSTOP)
        try:
            with pytest.raises(RunnerError) as raised:  # not a wait for good
                impatient.paste("loop-t1", "nobody will read this")
        finally:
            os.kill(server_pid, signal.SIGCONT)

        assert raised.value.reason == "tmux-timeout"
        assert f"tmux -L {terminal.socket_name} ls" in str(raised.value)
        assert impatient.pane_dead("loop-t1") is False  # the server answers again once resumed
