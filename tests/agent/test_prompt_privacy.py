"""No prompt is ever in a process's argv: any local user can read ``/proc/<pid>/cmdline``.

Each case applies a dispatch whose prompt carries a fresh secret through the real applier, real
tmux and the fake harness, and looks, while the harness runs, at what it was started with and
at every command line on the machine.
"""

from __future__ import annotations

import threading
import uuid
from pathlib import Path

import pytest

from looprelay.agent.apply import ApplyResult
from looprelay.agent.tmux import TmuxTerminal
from looprelay.errors import RunnerError
from tests.agent.conftest import SESSION, Rig, make_dispatch
from tests.fake_harness import DEADLINE_SECONDS, FakeHarness, cmdlines_holding, wait_until

PASTE_START, PASTE_END = "\x1b[200~", "\x1b[201~"


def _secret() -> str:
    return f"comment body {uuid.uuid4()} from the issue"


def _bracketed(text: str) -> str:
    return PASTE_START + text.replace("\n", "\r") + PASTE_END + "\r"


def _assert_nowhere_in_argv(fake: FakeHarness, secret: str) -> None:
    for start in fake.starts():
        assert not any(secret in arg for arg in start["argv"]), start["argv"]
    assert cmdlines_holding(secret) == {}


class TestHostedSessions:
    def test_a_spawn_prompt_is_pasted_and_never_in_argv(
        self, rig: Rig, fake_harness: FakeHarness
    ) -> None:
        secret = _secret()
        result = rig.applier.apply(make_dispatch(prompt=f"# Issue\n{secret}"))
        assert result.status == "spawned"
        (start,) = fake_harness.wait_ready()
        wait_until(lambda: fake_harness.received(start["pid"]) == _bracketed(f"# Issue\n{secret}"))
        pane = rig.terminal.pane(SESSION)
        assert pane is not None and pane.pid == start["pid"] and not pane.dead  # still running
        _assert_nowhere_in_argv(fake_harness, secret)

    def test_a_delivered_comment_and_a_respawn_prompt_are_never_in_argv(
        self, rig: Rig, fake_harness: FakeHarness
    ) -> None:
        rig.applier.apply(make_dispatch())
        (first,) = fake_harness.wait_ready()
        delivered = _secret()
        assert rig.applier.apply(make_dispatch(kind="deliver", seq=2, prompt=delivered)).status == (
            "delivered"
        )
        wait_until(lambda: delivered in fake_harness.received(first["pid"]))
        _assert_nowhere_in_argv(fake_harness, delivered)

        rig.terminal.terminate_harness(SESSION, 1.0)
        respawned = _secret()
        result = rig.applier.apply(make_dispatch(kind="deliver", seq=3, prompt=respawned))
        assert (result.status, result.resumed) == ("spawned", True)
        second = fake_harness.wait_ready(2)[-1]
        wait_until(lambda: fake_harness.received(second["pid"]) == _bracketed(respawned))
        _assert_nowhere_in_argv(fake_harness, respawned)

    def test_a_harness_that_exits_at_once_gets_no_paste_and_tmux_lives_on(
        self, rig: Rig, fake_harness: FakeHarness
    ) -> None:
        fake_harness.mark("exit-once")
        result = rig.applier.apply(make_dispatch())
        assert (result.status, result.reason) == ("failed", "harness-failed")
        assert rig.terminal.pane_dead(SESSION) is True  # the server still answers
        assert cmdlines_holding(make_dispatch().prompt) == {}


class TestHeadlessTurns:
    def test_a_turn_reads_its_prompt_on_stdin_and_never_in_argv(
        self, rig: Rig, fake_harness: FakeHarness
    ) -> None:
        fake_harness.mark("headless-hold")  # the turn waits, running, until released
        secret = _secret()
        results: list[ApplyResult] = []
        turn = threading.Thread(
            target=lambda: results.append(
                rig.applier.apply(make_dispatch(runner_kind="process", prompt=f"-{secret}"))
            )
        )
        turn.start()
        try:
            wait_until(fake_harness.stdin, what="the turn to read its stdin")
            (start,) = fake_harness.starts()
            assert Path(f"/proc/{start['pid']}").exists()  # the turn runs now
            _assert_nowhere_in_argv(fake_harness, secret)
        finally:
            fake_harness.mark("release")
            turn.join(DEADLINE_SECONDS)
        assert [r.status for r in results] == ["done"]
        assert fake_harness.stdin() == [f"-{secret}"]


class TestPaste:
    def test_a_paste_into_a_dead_pane_is_refused_and_the_server_survives(
        self, terminal: TmuxTerminal, fake_harness: FakeHarness, tmp_path: Path
    ) -> None:
        # tmux 3.3a's server crashes on a paste-buffer into a dead pane.
        fake_harness.mark("exit-once")
        terminal.spawn(SESSION, cwd=tmp_path, argv=[fake_harness.claude])
        wait_until(lambda: terminal.pane_dead(SESSION))
        with pytest.raises(RunnerError) as caught:
            terminal.paste(SESSION, "hello")
        assert caught.value.reason == "harness-failed"
        assert terminal.has_session(SESSION)
