"""The applier end to end: real tmux, a real ledger file, the fake harness first on PATH."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from looprelay.agent.apply import ApplyResult
from looprelay.agent.ledger import LocalSession
from looprelay.agent.workspaces import Workspaces
from tests.agent.conftest import FRESH_ID, SESSION, SESSION_ID, WORK_ITEM, Rig, make_dispatch
from tests.fake_harness import FakeHarness, wait_until
from tests.gitrepos import git

SAME_REPO = {"fork": False}
"""A same-repository pull request's head, as the server sends it."""

PASTE_START, PASTE_END = "\x1b[200~", "\x1b[201~"
FLAG_SHAPED = "--dangerously-skip-permissions"


BOOT = make_dispatch().prompt
"""The prompt a dispatch carries unless a test names one."""


def _bracketed(text: str) -> str:
    return PASTE_START + text.replace("\n", "\r") + PASTE_END + "\r"


class TestSpawn:
    def test_spawns_the_harness_in_a_worktree_of_the_configured_checkout(
        self, rig: Rig, fake_harness: FakeHarness
    ) -> None:
        tree = rig.workspace / SESSION
        result = rig.applier.apply(make_dispatch(prompt="# Issue 15\nfix the bug"))
        commit = git("rev-parse", "HEAD", cwd=rig.checkout)
        assert result == replace(
            result,
            status="spawned",
            reason="",
            detail=f"spawned in {tree}",
            session_id=SESSION_ID,
            tmux_target=SESSION,
        )
        events = {event["name"]: event["data"] for event in result.events}
        assert events["workspace.prepared"] == {
            "checkout": str(tree),
            "strategy": "operator-worktree",
            "branch": SESSION,
            "commit": commit,
            "reused": "false",
            "trusted": "true",
        }
        assert events["skill.installed"]["cwd"] == str(tree)
        assert events["workspace.trusted"]["cwd"] == str(tree)
        assert (tree / ".claude" / "skills" / "looprelay" / "SKILL.md").is_file()
        assert git("status", "--porcelain", cwd=tree) == ""  # the skill ignores itself
        (start,) = fake_harness.wait_ready()
        assert start["argv"] == ["--session-id", SESSION_ID, "--model", "opus"]
        # The boot prompt is never in argv: it is pasted once the harness is up.
        wait_until(
            lambda: fake_harness.received(start["pid"]) == _bracketed("# Issue 15\nfix the bug")
        )
        assert start["cwd"] == str(tree)
        assert git("rev-parse", "HEAD", cwd=tree) == git("rev-parse", "HEAD", cwd=rig.checkout)
        assert rig.ledger.session(SESSION) == LocalSession(
            session_name=SESSION,
            work_item=WORK_ITEM,
            endpoint=WORK_ITEM,
            session_id=SESSION_ID,
            checkout=str(tree),
            created_checkout=True,
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
        pasted = _bracketed(BOOT) + _bracketed(text)
        wait_until(lambda: fake_harness.received(start["pid"]) == pasted)
        time.sleep(0.1)  # nothing more arrives: one paste, one Enter each
        assert fake_harness.received(start["pid"]) == pasted
        assert len(fake_harness.starts()) == 1

    def test_a_spawn_that_finds_the_session_live_delivers_into_it(
        self, rig: Rig, fake_harness: FakeHarness
    ) -> None:
        rig.applier.apply(make_dispatch())
        (start,) = fake_harness.wait_ready()
        result = rig.applier.apply(make_dispatch(prompt="again", resume=True))
        assert result.status == "delivered"
        pasted = _bracketed(BOOT) + _bracketed("again")
        wait_until(lambda: fake_harness.received(start["pid"]) == pasted)
        assert len(fake_harness.starts()) == 1

    def test_a_pull_request_endpoint_gets_a_workspace_directory(
        self, rig: Rig, fake_harness: FakeHarness
    ) -> None:
        name = "loop-github-octo-repo-16"
        dispatch = make_dispatch(endpoint="github:octo/repo#16", session_name=name, head=SAME_REPO)
        assert rig.applier.apply(dispatch).status == "spawned"
        (start,) = fake_harness.wait_ready()
        assert start["cwd"] == str(rig.workspace / name)
        head = git("rev-parse", "HEAD", cwd=rig.workspace / name)
        assert head == rig.repos.tip("octo/repo", "refs/pull/16/head")  # at the PR's head
        local = rig.ledger.session(name)
        assert local is not None and local.created_checkout

    def test_a_session_id_claude_already_has_is_swapped_for_a_fresh_one(
        self, rig: Rig, fake_harness: FakeHarness, private_claude_config: Path
    ) -> None:
        # A store reset, or a second deployment on this machine, offers an id Claude has used.
        project = private_claude_config / "projects" / "-somewhere-else"
        project.mkdir(parents=True)
        (project / f"{SESSION_ID}.jsonl").write_text("{}\n")

        result = rig.applier.apply(make_dispatch())

        assert (result.status, result.reason, result.session_id) == (
            "spawned",
            "session-id-in-use",
            FRESH_ID,
        )
        (start,) = fake_harness.wait_ready()
        assert start["argv"][:2] == ["--session-id", FRESH_ID]
        replaced = [e for e in result.events if e["name"] == "session.id_replaced"]
        assert replaced == [
            {"name": "session.id_replaced", "data": {"was": SESSION_ID, "now": FRESH_ID}}
        ]

    def test_a_config_claude_cannot_parse_is_reported_and_the_spawn_goes_ahead(
        self, rig: Rig, fake_harness: FakeHarness, private_claude_config: Path
    ) -> None:
        config = private_claude_config / ".claude.json"
        config.write_text("{not json")

        result = rig.applier.apply(make_dispatch())

        assert result.status == "spawned"
        [failed] = [e for e in result.events if e["name"] == "workspace.trust_failed"]
        assert "trust" in str(failed["data"]) or str(config) in str(failed["data"])
        assert config.read_text() == "{not json"  # never written over
        fake_harness.wait_ready()

    def test_folder_trust_is_accepted_for_the_sessions_tree(
        self, rig: Rig, fake_harness: FakeHarness, private_claude_config: Path
    ) -> None:
        rig.applier.apply(make_dispatch())

        config = json.loads((private_claude_config / ".claude.json").read_text())
        tree = str((rig.workspace / SESSION).resolve())
        assert config["projects"][tree]["hasTrustDialogAccepted"] is True


class TestSpawnProbe:
    def test_a_harness_that_dies_at_once_fails_the_spawn_with_its_status_and_last_lines(
        self, rig: Rig, fake_harness: FakeHarness
    ) -> None:
        fake_harness.mark("exit-once")
        result = rig.applier.apply(make_dispatch())
        assert (result.status, result.reason, result.retryable) == (
            "failed",
            "harness-failed",
            False,
        )
        # tmux 3.3a does not always learn the status of a child that exits before it is read
        # (about 1 run in 3 here): when shown, it is the harness's own.
        said = rf"the harness in {SESSION} exited( \(status 3\))? before it could be given"
        assert re.search(said, result.detail), result.detail
        assert "fake harness: not logged in, exiting at once" in result.detail
        # The work item is told why, in the harness's own last words.
        assert result.reply == (
            "😕 claude session did not start: `fake harness: not logged in, exiting at once`"
        )
        assert rig.terminal.pane(SESSION) is not None  # its dead pane stays, to read

    def test_a_harness_that_dies_right_after_its_boot_prompt_is_not_reported_running(
        self, rig: Rig, fake_harness: FakeHarness
    ) -> None:
        rig.applier.spawn_probe_seconds = 5.0
        done = threading.Event()

        def kill_once_pasted() -> None:
            start = fake_harness.wait_ready()[0]
            wait_until(lambda: fake_harness.received(start["pid"]))
            os.kill(start["pid"], signal.SIGKILL)
            done.set()

        killer = threading.Thread(target=kill_once_pasted, daemon=True)
        killer.start()
        result = rig.applier.apply(make_dispatch())
        killer.join(10)
        assert done.is_set()
        assert (result.status, result.reason) == ("failed", "harness-failed")
        assert "right after it was given the prompt" in result.detail
        assert "fake harness ready" in result.detail

    def test_a_live_pane_has_no_exit_status(self, rig: Rig, fake_harness: FakeHarness) -> None:
        rig.applier.apply(make_dispatch())
        pane = rig.terminal.pane(SESSION)
        assert pane is not None and (pane.dead, pane.exit_status) == (False, None)


class TestRespawn:
    def test_a_dead_pane_is_respawned_resuming_with_the_event_as_boot_prompt(
        self, rig: Rig, fake_harness: FakeHarness
    ) -> None:
        fake_harness.mark("exit-once")
        rig.applier.apply(make_dispatch())
        wait_until(lambda: rig.terminal.pane_dead(SESSION))
        later = make_dispatch(
            kind="deliver", seq=2, prompt="-v next event", boot_prompt="the spawn prompt"
        )
        result = rig.applier.apply(later)
        assert (result.status, result.resumed, result.session_id, result.reason) == (
            "spawned",
            True,
            SESSION_ID,
            "",
        )
        (start,) = fake_harness.wait_ready()
        assert start["argv"] == ["--resume", SESSION_ID, "--model", "opus"]
        wait_until(lambda: fake_harness.received(start["pid"]) == _bracketed("-v next event"))

    def test_an_unresumable_conversation_falls_back_to_a_fresh_session_booted_whole(
        self, rig: Rig, fake_harness: FakeHarness
    ) -> None:
        fake_harness.mark("resume-fails")
        rig.applier.resume_probe_seconds = 5.0  # the fake must have time to die on a slow box
        # The fresh harness knows nothing: it gets the spawn prompt with the event, not the
        # event alone.
        deliver = make_dispatch(kind="deliver", prompt="hello", boot_prompt="context; hello")
        result = rig.applier.apply(deliver)
        assert (result.status, result.resumed, result.session_id, result.reason) == (
            "spawned",
            False,
            FRESH_ID,
            "resume-failed",
        )
        (start,) = fake_harness.wait_ready()
        assert start["argv"] == ["--session-id", FRESH_ID, "--model", "opus"]
        wait_until(lambda: fake_harness.received(start["pid"]) == _bracketed("context; hello"))
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

    def test_a_harness_the_runner_does_not_serve_is_refused_though_it_is_on_path(
        self, rig: Rig, fake_harness: FakeHarness
    ) -> None:
        rig.applier.preparer.served = frozenset({"cursor-agent"})  # runner run --harness
        result = rig.applier.apply(make_dispatch())
        assert (result.status, result.reason) == ("failed", "harness-missing")
        assert result.detail == "this runner serves only cursor-agent (--harness), not claude"
        assert fake_harness.starts() == []

    def test_cursor_agent_in_tmux_is_refused(self, rig: Rig, fake_harness: FakeHarness) -> None:
        result = rig.applier.apply(make_dispatch(harness="cursor-agent"))
        assert (result.status, result.reason) == ("failed", "harness-unsupported")
        assert fake_harness.starts() == []

    def test_no_checkout_fails_with_its_reason(self, rig: Rig, fake_harness: FakeHarness) -> None:
        rig.applier.preparer.workspaces = Workspaces(
            configured={}, root=None, worktrees=rig.workspace
        )
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
        rig.applier.apply(
            make_dispatch(endpoint="github:octo/repo#16", session_name=pr_session, head=SAME_REPO)
        )
        rig.applier.apply(
            make_dispatch(
                work_item="github:octo/repo#99", endpoint="github:octo/repo#99", session_name=other
            )
        )
        fake_harness.wait_ready(3)
        result = rig.applier.apply(make_dispatch(kind="cleanup"))
        assert (result.status, result.detail) == (
            "done",
            "killed 2 tmux session(s); checkouts removed 2",
        )
        assert sorted(e["data"]["checkout"] for e in result.events) == sorted(
            [str(rig.workspace / SESSION), str(rig.workspace / pr_session)]
        )
        assert rig.terminal.pane_dead(SESSION) is None
        assert rig.terminal.pane_dead(pr_session) is None
        assert rig.terminal.pane_dead(other) is False
        assert rig.checkout.is_dir()  # the operator's: only its worktree goes
        assert not (rig.workspace / SESSION).exists()
        assert not (rig.workspace / pr_session).exists()
        assert (rig.workspace / other).is_dir()
        assert rig.ledger.session(other) is not None
        assert rig.ledger.sessions_for(WORK_ITEM) == []


class TestCleanupOnClose:
    def test_a_close_keeps_the_tree_when_the_operator_asked(
        self, rig: Rig, fake_harness: FakeHarness
    ) -> None:
        rig.applier.apply(make_dispatch())
        fake_harness.wait_ready()
        rig.applier.preparer.workspaces.keep_on_close = True

        result = rig.applier.apply(make_dispatch(kind="cleanup", closing=True))

        assert (result.status, result.detail) == (
            "done",
            "killed 1 tmux session(s); checkouts kept on close",
        )
        assert (rig.workspace / SESSION).is_dir()
        assert rig.terminal.pane_dead(SESSION) is None

    def test_a_cleanup_command_removes_it_even_then(
        self, rig: Rig, fake_harness: FakeHarness
    ) -> None:
        rig.applier.apply(make_dispatch())
        fake_harness.wait_ready()
        rig.applier.preparer.workspaces.keep_on_close = True

        rig.applier.apply(make_dispatch(kind="cleanup"))

        assert not (rig.workspace / SESSION).exists()


class TestHeadless:
    def test_one_turn_then_a_resumed_turn(self, rig: Rig, fake_harness: FakeHarness) -> None:
        first = rig.applier.apply(make_dispatch(runner_kind="process", prompt="-- go"))
        assert (first.status, first.session_id, first.tmux_target) == ("done", SESSION_ID, "")
        assert (first.reply, first.detail) == ("ok", "exit 0; success; answered in 2 characters")
        second = rig.applier.apply(make_dispatch(runner_kind="process", kind="deliver", seq=2))
        assert (second.status, second.resumed) == ("done", True)
        argvs = [start["argv"] for start in fake_harness.starts()]
        assert argvs == [
            ["-p", "--output-format", "json", "--session-id", SESSION_ID, "--model", "opus"],
            ["-p", "--output-format", "json", "--resume", SESSION_ID, "--model", "opus"],
        ]
        assert fake_harness.stdin() == ["-- go", BOOT]  # the prompts, on stdin only
        assert {start["cwd"] for start in fake_harness.starts()} == {str(rig.workspace / SESSION)}

    def test_the_answer_is_the_reply_whole_however_long(
        self, rig: Rig, fake_harness: FakeHarness
    ) -> None:
        # About 300 KB printed: far past the 4 KiB tail a turn kept before.
        answer = "## Done\n\n" + "Fixed ü 🙂 `x`.\n" * 20_000
        fake_harness.answer(answer)
        result = rig.applier.apply(make_dispatch(runner_kind="process"))
        assert (result.status, result.reply) == ("done", answer.strip())
        assert result.detail == f"exit 0; success; answered in {len(answer.strip())} characters"

    def test_a_failing_turn_reports_the_harness_message_first_and_a_short_reply(
        self, rig: Rig, fake_harness: FakeHarness
    ) -> None:
        """Claude 2.x not logged in: ``is_error`` true, its message as ``result``, exit 1."""
        fake_harness.mark("headless-fail")
        dispatch = make_dispatch(runner_kind="process")
        result = rig.applier.apply(dispatch)
        assert replace(result, events=()) == ApplyResult(
            "failed",
            reason="harness-failed",
            detail="claude: Not logged in · Please run /login (exit 1)",
            reply="😕 claude turn failed: `Not logged in · Please run /login`",
        )
        local = rig.ledger.session(SESSION)
        assert local is not None and local.session_id == ""  # nothing to resume from it
        assert rig.applier.apply(dispatch) == result  # the ledger gives the same reply again
        # The tree it ran in is still the agent's to remove.
        rig.applier.apply(make_dispatch(kind="cleanup"))
        assert not Path(local.checkout).exists()

    def test_a_harness_that_dies_without_json_is_failed_with_its_last_words(
        self, rig: Rig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        crash = tmp_path / "crash"
        crash.mkdir()
        script = crash / "claude"
        script.write_text(
            "#!/bin/sh\necho loading >&2\necho 'Error: Session ID in use' >&2\nexit 1\n"
        )
        script.chmod(0o755)
        monkeypatch.setenv("PATH", f"{crash}:/usr/bin:/bin")
        result = rig.applier.apply(make_dispatch(runner_kind="process"))
        assert (result.status, result.reason) == ("failed", "harness-failed")
        assert result.detail.startswith("claude: loading · Error: Session ID in use (exit 1); ")
        assert result.reply == "😕 claude turn failed: `loading · Error: Session ID in use`"

    def test_a_turn_past_its_timeout_is_killed(self, rig: Rig, fake_harness: FakeHarness) -> None:
        fake_harness.mark("headless-hang")
        rig.applier.headless_timeout_seconds = 0.5
        result = rig.applier.apply(make_dispatch(runner_kind="process"))
        assert (result.status, result.reason) == ("failed", "harness-timeout")

    def test_a_ledger_row_from_before_replies_still_loads(self) -> None:
        old_row = {"status": "done", "reason": "", "retryable": False, "detail": "exit 0"}
        assert ApplyResult.from_record(old_row) == ApplyResult("done", detail="exit 0")

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
