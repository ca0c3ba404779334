"""The applier end to end: real tmux, a real ledger file, the fake harness first on PATH."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from looprelay.agent.apply import ApplyResult
from looprelay.agent.checkouts import Checkouts, parse_checkout_pairs
from looprelay.agent.ledger import LocalSession
from looprelay.errors import ConfigError
from tests.agent.conftest import FRESH_ID, SESSION, SESSION_ID, WORK_ITEM, Rig, make_dispatch
from tests.fake_harness import FakeHarness, wait_until

PASTE_START, PASTE_END = "\x1b[200~", "\x1b[201~"
FLAG_SHAPED = "--dangerously-skip-permissions"


def _bracketed(text: str) -> str:
    return PASTE_START + text.replace("\n", "\r") + PASTE_END + "\r"


class TestSpawn:
    def test_spawns_the_harness_in_the_configured_checkout(
        self, rig: Rig, fake_harness: FakeHarness
    ) -> None:
        result = rig.applier.apply(make_dispatch(prompt="# Issue 15\nfix the bug"))
        assert result == ApplyResult(
            "spawned",
            detail=f"spawned in {rig.checkout}",
            session_id=SESSION_ID,
            tmux_target=SESSION,
        )
        (start,) = fake_harness.wait_ready()
        assert start["argv"] == [
            "--session-id",
            SESSION_ID,
            "--model",
            "opus",
            "# Issue 15\nfix the bug",
        ]
        assert start["cwd"] == str(rig.checkout)
        assert rig.ledger.session(SESSION) == LocalSession(
            session_name=SESSION,
            work_item=WORK_ITEM,
            endpoint=WORK_ITEM,
            session_id=SESSION_ID,
            checkout=str(rig.checkout),
            created_checkout=False,
            harness="claude",
            runner_kind="tmux",
        )

    def test_a_second_event_is_pasted_once_into_the_same_session(
        self, rig: Rig, fake_harness: FakeHarness
    ) -> None:
        rig.applier.apply(make_dispatch())
        (start,) = fake_harness.wait_ready()
        text = "New comment by @octocat:\n\n> please also\n> add tests\n\nThanks;"
        result = rig.applier.apply(make_dispatch(kind="deliver", seq=2, prompt=text))
        assert (result.status, result.tmux_target, result.session_id) == (
            "delivered",
            SESSION,
            SESSION_ID,
        )
        wait_until(lambda: fake_harness.received(start["pid"]) == _bracketed(text))
        time.sleep(0.1)  # nothing more arrives: one paste, one Enter
        assert fake_harness.received(start["pid"]) == _bracketed(text)
        assert len(fake_harness.starts()) == 1

    def test_a_spawn_that_finds_the_session_live_delivers_into_it(
        self, rig: Rig, fake_harness: FakeHarness
    ) -> None:
        rig.applier.apply(make_dispatch())
        (start,) = fake_harness.wait_ready()
        result = rig.applier.apply(make_dispatch(prompt="again", resume=True))
        assert result.status == "delivered"
        wait_until(lambda: fake_harness.received(start["pid"]) == _bracketed("again"))
        assert len(fake_harness.starts()) == 1

    def test_a_pull_request_endpoint_gets_a_workspace_directory(
        self, rig: Rig, fake_harness: FakeHarness
    ) -> None:
        name = "loop-github-octo-repo-16"
        dispatch = make_dispatch(endpoint="github:octo/repo#16", session_name=name)
        assert rig.applier.apply(dispatch).status == "spawned"
        (start,) = fake_harness.wait_ready()
        assert start["cwd"] == str(rig.workspace / name)
        local = rig.ledger.session(name)
        assert local is not None and local.created_checkout


class TestRespawn:
    def test_a_dead_pane_is_respawned_resuming_with_the_event_as_boot_prompt(
        self, rig: Rig, fake_harness: FakeHarness
    ) -> None:
        fake_harness.mark("exit-once")
        rig.applier.apply(make_dispatch())
        wait_until(lambda: rig.terminal.pane_dead(SESSION))
        result = rig.applier.apply(make_dispatch(kind="deliver", seq=2, prompt="-v next event"))
        assert (result.status, result.resumed, result.session_id, result.reason) == (
            "spawned",
            True,
            SESSION_ID,
            "",
        )
        (start,) = fake_harness.wait_ready()
        assert start["argv"] == ["--resume", SESSION_ID, "--model", "opus", " -v next event"]

    def test_an_unresumable_conversation_falls_back_to_a_fresh_session(
        self, rig: Rig, fake_harness: FakeHarness
    ) -> None:
        fake_harness.mark("resume-fails")
        rig.applier.resume_probe_seconds = 5.0  # the fake must have time to die on a slow box
        result = rig.applier.apply(make_dispatch(kind="deliver", prompt="hello"))
        assert (result.status, result.resumed, result.session_id, result.reason) == (
            "spawned",
            False,
            FRESH_ID,
            "resume-failed",
        )
        (start,) = fake_harness.wait_ready()
        assert start["argv"] == ["--session-id", FRESH_ID, "--model", "opus", "hello"]
        local = rig.ledger.session(SESSION)
        assert local is not None and local.session_id == FRESH_ID

    @pytest.mark.parametrize("kind", ["spawn", "deliver"])
    def test_a_flag_shaped_session_id_never_reaches_the_harness(
        self, rig: Rig, fake_harness: FakeHarness, kind: str
    ) -> None:
        result = rig.applier.apply(make_dispatch(kind=kind, session_id=FLAG_SHAPED, resume=True))
        assert (result.status, result.session_id, result.reason) == (
            "spawned",
            FRESH_ID,
            "resume-failed",
        )
        (start,) = fake_harness.wait_ready()
        assert FLAG_SHAPED not in start["argv"]
        assert start["argv"][:2] == ["--session-id", FRESH_ID]


class TestRefusals:
    def test_a_missing_harness_binary_fails_with_its_reason(
        self, rig: Rig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        only_tmux = tmp_path / "only-tmux"
        only_tmux.mkdir()
        (only_tmux / "tmux").symlink_to(shutil.which("tmux") or "tmux")
        monkeypatch.setenv("PATH", str(only_tmux))
        result = rig.applier.apply(make_dispatch())
        assert (result.status, result.reason, result.retryable) == (
            "failed",
            "harness-missing",
            False,
        )
        assert rig.terminal.pane_dead(SESSION) is None

    def test_cursor_agent_in_tmux_is_refused(self, rig: Rig, fake_harness: FakeHarness) -> None:
        result = rig.applier.apply(make_dispatch(harness="cursor-agent"))
        assert (result.status, result.reason) == ("failed", "harness-unsupported")
        assert fake_harness.starts() == []

    def test_no_checkout_fails_with_its_reason(self, rig: Rig, fake_harness: FakeHarness) -> None:
        rig.applier.checkouts = Checkouts()
        result = rig.applier.apply(make_dispatch())
        assert (result.status, result.reason) == ("failed", "checkout-missing")

    def test_a_dispatch_seen_before_is_reported_again_not_applied_again(
        self, rig: Rig, fake_harness: FakeHarness
    ) -> None:
        dispatch = make_dispatch()
        first = rig.applier.apply(dispatch)
        fake_harness.wait_ready()
        assert rig.applier.apply(dispatch) == first
        assert len(fake_harness.starts()) == 1

    @pytest.mark.parametrize("kind", ["pause", "resume"])
    def test_pause_and_resume_are_acknowledged(self, rig: Rig, kind: str) -> None:
        assert rig.applier.apply(make_dispatch(kind=kind)).status == "done"


class TestTerminate:
    @pytest.mark.parametrize(("ignore_term", "outcome"), [(False, "terminated"), (True, "killed")])
    def test_ends_the_harness_and_keeps_the_session(
        self, rig: Rig, fake_harness: FakeHarness, ignore_term: bool, outcome: str
    ) -> None:
        if ignore_term:
            fake_harness.mark("ignore-term")
        rig.applier.apply(make_dispatch())
        fake_harness.wait_ready()
        result = rig.applier.apply(make_dispatch(kind="terminate"))
        assert (result.status, result.detail) == ("done", f"harness {outcome}; tmux session kept")
        assert rig.terminal.pane_dead(SESSION) is True

    def test_can_kill_the_session_instead(self, rig: Rig, fake_harness: FakeHarness) -> None:
        rig.applier.keep_session_on_terminate = False
        rig.applier.apply(make_dispatch())
        fake_harness.wait_ready()
        assert rig.applier.apply(make_dispatch(kind="terminate")).status == "done"
        assert rig.terminal.pane_dead(SESSION) is None


class TestCleanup:
    def test_kills_the_work_items_sessions_and_removes_only_created_checkouts(
        self, rig: Rig, fake_harness: FakeHarness
    ) -> None:
        pr_session, other = "loop-github-octo-repo-16", "loop-github-octo-repo-99"
        rig.applier.apply(make_dispatch())
        rig.applier.apply(make_dispatch(endpoint="github:octo/repo#16", session_name=pr_session))
        rig.applier.apply(
            make_dispatch(
                work_item="github:octo/repo#99", endpoint="github:octo/repo#99", session_name=other
            )
        )
        fake_harness.wait_ready(3)
        result = rig.applier.apply(make_dispatch(kind="cleanup"))
        assert result == ApplyResult(
            "done", detail="killed 2 tmux session(s), removed 1 checkout(s)"
        )
        assert rig.terminal.pane_dead(SESSION) is None
        assert rig.terminal.pane_dead(pr_session) is None
        assert rig.terminal.pane_dead(other) is False
        assert rig.checkout.is_dir()  # configured: never removed
        assert not (rig.workspace / pr_session).exists()
        assert rig.ledger.session(other) is not None
        assert rig.ledger.sessions_for(WORK_ITEM) == []


class TestHeadless:
    def test_one_turn_then_a_resumed_turn(self, rig: Rig, fake_harness: FakeHarness) -> None:
        first = rig.applier.apply(make_dispatch(runner_kind="process", prompt="-- go"))
        assert (first.status, first.session_id, first.tmux_target) == ("done", SESSION_ID, "")
        assert first.detail.startswith("exit 0; stdout: ")
        assert SESSION_ID in first.detail
        second = rig.applier.apply(make_dispatch(runner_kind="process", kind="deliver", seq=2))
        assert (second.status, second.resumed) == ("done", True)
        argvs = [start["argv"] for start in fake_harness.starts()]
        assert argvs[0] == [
            *("-p", "--output-format", "json", "--session-id", SESSION_ID),
            *("--model", "opus", " -- go"),
        ]
        assert argvs[1][:6] == ["-p", "--output-format", "json", "--resume", SESSION_ID, "--model"]
        assert {start["cwd"] for start in fake_harness.starts()} == {str(rig.checkout)}

    def test_a_failing_turn_reports_its_exit_code_and_stderr(
        self, rig: Rig, fake_harness: FakeHarness
    ) -> None:
        fake_harness.mark("headless-fail")
        result = rig.applier.apply(make_dispatch(runner_kind="process"))
        assert (result.status, result.reason, result.retryable) == (
            "failed",
            "harness-failed",
            False,
        )
        assert result.detail.startswith("exit 2;")
        assert "boom: not logged in" in result.detail

    def test_a_turn_past_its_timeout_is_killed(self, rig: Rig, fake_harness: FakeHarness) -> None:
        fake_harness.mark("headless-hang")
        rig.applier.headless_timeout_seconds = 0.5
        result = rig.applier.apply(make_dispatch(runner_kind="process"))
        assert (result.status, result.reason) == ("failed", "harness-timeout")

    def test_cursor_agent_reports_the_id_it_printed(
        self, rig: Rig, fake_harness: FakeHarness
    ) -> None:
        result = rig.applier.apply(make_dispatch(runner_kind="process", harness="cursor-agent"))
        assert (result.status, result.session_id) == (
            "done",
            "11111111-2222-4333-8444-555555555555",
        )
        (start,) = fake_harness.starts()
        assert start["harness"] == "cursor-agent"
        assert "--session-id" not in start["argv"]


class TestCheckouts:
    def test_pairs_parse_and_bad_ones_name_the_fix(self, tmp_path: Path) -> None:
        assert parse_checkout_pairs([f"Octo/Repo={tmp_path}"]) == {"octo/repo": tmp_path}
        for bad in ["octo/repo", "octo=/x", "octo/repo=relative/path", "a/b/c=/x"]:
            with pytest.raises(ConfigError, match="owner/repo=/absolute/path"):
                parse_checkout_pairs([bad])

    def test_only_a_workspace_can_check_out_pull_requests(self, tmp_path: Path) -> None:
        assert not Checkouts(configured={"octo/repo": tmp_path}).can_checkout_pull_requests()
        assert Checkouts(workspace_root=tmp_path).can_checkout_pull_requests()

    def test_remove_touches_only_directories_directly_in_the_workspace(
        self, tmp_path: Path
    ) -> None:
        root, outside = tmp_path / "ws", tmp_path / "outside"
        configured = root / "loop-configured"
        for directory in (root / "loop-a" / "deep", outside, configured):
            directory.mkdir(parents=True)
        (root / "loop-link").symlink_to(outside)
        checkouts = Checkouts(configured={"octo/repo": configured}, workspace_root=root)
        assert not checkouts.remove(outside)
        assert not checkouts.remove(root)
        assert not checkouts.remove(root / "loop-a" / "deep")
        assert not checkouts.remove(root / "loop-link")
        assert not checkouts.remove(configured)
        assert checkouts.remove(root / "loop-a")
        assert sorted(p.name for p in root.iterdir()) == ["loop-configured", "loop-link"]
        assert outside.is_dir()
