"""looprelay end to end with the real, pinned Claude Code CLI (issue 12, "Tests"), on each store.

An operator's machine (tests/harness/machine.py) runs ``looprelay up`` and ``looprelay runner
run``; comments are delivered as GitHub would send them; the agent spawns the real ``claude`` in
real tmux, in git worktrees of offline repositories. Claude is not logged in, so it answers
"Not logged in" to everything, but it records every message it was given, with its ``cwd`` and
``sessionId``, in its transcript: that transcript is what these tests read.
"""

from __future__ import annotations

import os
import signal
import uuid
from pathlib import Path

import pytest

from looprelay.agent.skill import SKILL_FILES, SKILL_PATH, skill_files
from tests.claude_cli import UserMessage
from tests.fake_github import APP_LOGIN, FakeGitHub
from tests.fake_harness import wait_until
from tests.gitrepos import git
from tests.harness.machine import (
    DEADLINE,
    FORK,
    REPO,
    Deployment,
    Machine,
    head_of,
    run_cli,
    session_name,
)

pytestmark = pytest.mark.real_cli  # run apart from the parallel workers

NOT_LOGGED_IN = "Not logged in · Please run /login"


def _token() -> str:
    return f"tok-{uuid.uuid4().hex[:12]}"


def _said(machine: Machine, deployment: Deployment, text: str) -> UserMessage:
    """Wait for the user message carrying ``text`` in Claude's transcript."""
    return machine.wait_for(lambda m: text in m.text, explain=deployment.explain)


class TestWorkItemSession:
    def test_a_start_comment_reaches_claude_in_a_worktree_at_the_main_commit(
        self, relay: Deployment, machine: Machine
    ) -> None:
        spawned = relay.start(1)
        cwd = Path(spawned.cwd)

        assert "## Interaction mode: work-item" in spawned.text
        # A worktree of the operator's checkout, of its own, under the runner's workspace root.
        assert cwd == machine.workspace / session_name(1)
        assert git("rev-parse", "--path-format=absolute", "--git-common-dir", cwd=cwd) == str(
            machine.checkout / ".git"
        )
        assert head_of(cwd) == machine.repos.tip(REPO) == machine.main
        # The prompt reached the transcript, so no trust dialog ate it; the runner said yes.
        assert machine.trusted(cwd)["hasTrustDialogAccepted"] is True
        assert head_of(machine.checkout) == machine.main
        assert git("status", "--porcelain", cwd=machine.checkout) == ""
        # What the runner did is in the server's event log, where the operator looks (once it
        # reports the spawn: after its probe, a moment after Claude took the prompt).
        prepared = wait_until(
            lambda: [e["data"] for e in relay.events("workspace.prepared")], seconds=DEADLINE
        )
        assert {"checkout": str(cwd), "commit": machine.main}.items() <= prepared[0].items()
        trusted = [e["data"] for e in relay.events("workspace.trusted")]
        assert any(t["cwd"] == str(cwd) for t in trusted)

    def test_the_loops_skill_is_in_the_sessions_directory_and_git_ignores_it(
        self, relay: Deployment
    ) -> None:
        cwd = Path(relay.start(1).cwd)

        installed = cwd.joinpath(*SKILL_PATH)
        assert {name: (installed / name).read_bytes() for name in SKILL_FILES} == {
            name: skill_files()[name] for name in SKILL_FILES
        }
        assert "name: looprelay" in (installed / "SKILL.md").read_text(encoding="utf-8")
        assert git("status", "--porcelain", "--untracked-files=all", cwd=cwd) == ""

    def test_a_later_comment_reaches_the_same_claude_session(
        self, relay: Deployment, machine: Machine
    ) -> None:
        spawned = relay.start(1)
        token = _token()
        relay.comment(1, f"One more thing:\nplease also look at {token}")

        later = _said(machine, relay, token)
        assert (later.session_id, later.cwd) == (spawned.session_id, spawned.cwd)
        assert sum(m.session_id == spawned.session_id for m in machine.messages()) >= 2

    def test_after_the_harness_is_killed_the_next_comment_resumes_the_same_session(
        self, relay: Deployment, machine: Machine
    ) -> None:
        spawned = relay.start(2)
        (runner,) = relay.runners
        name = session_name(2)
        [pid] = runner.tmux("list-panes", "-t", f"={name}:", "-F", "#{pane_pid}").split()
        os.kill(int(pid), signal.SIGKILL)
        wait_until(
            lambda: (
                runner.tmux("list-panes", "-t", f"={name}:", "-F", "#{pane_dead}").strip() == "1"
            ),
            seconds=DEADLINE,
            what="the killed harness's pane to be dead",
        )
        token = _token()
        relay.comment(2, f"Still there? {token}")

        resumed = _said(machine, relay, token)
        assert (resumed.session_id, resumed.cwd) == (spawned.session_id, spawned.cwd)
        [respawned] = wait_until(
            lambda: relay.events("session.respawned"),
            seconds=DEADLINE,
            what="the respawn to be reported",
            explain=relay.explain,
        )
        assert respawned["data"]["session_id"] == spawned.session_id
        assert runner.tmux("list-panes", "-t", f"={name}:", "-F", "#{pane_dead}").strip() == "0"
        transcripts = machine.claude.home.glob(f".claude/projects/*/{spawned.session_id}.jsonl")
        assert len(list(transcripts)) == 1


class TestPullRequestSession:
    @pytest.mark.parametrize(
        ("number", "fork"),
        [
            (5, None),
            (6, FORK),
        ],
        ids=["branch", "fork"],
    )
    def test_a_pull_request_gets_its_own_session_at_its_head_commit(
        self, relay: Deployment, machine: Machine, number: int, fork: str | None
    ) -> None:
        issue = relay.start(1)
        head = relay.open_pull_request(number, closes=1, fork=fork)
        name = session_name(number)
        if fork:  # a fork's head runs only once approved: `start` on the pull request itself
            relay.comment(number, "Reviewed: the-loop start", on_pull_request=True)

        spawned = machine.wait_for(lambda m: Path(m.cwd).name == name, explain=relay.explain)
        cwd = Path(spawned.cwd)
        assert cwd == machine.workspace / name
        assert head_of(cwd) == head != machine.main
        assert (cwd / f"pr-{number}.txt").is_file()
        # The event that spawned it: the opening one, or a fork's approval.
        assert ("Reviewed: the-loop start" if fork else f'"number": {number}') in spawned.text
        assert spawned.session_id != issue.session_id
        assert machine.trusted(cwd)["hasTrustDialogAccepted"] is True


class TestHeadless:
    def test_a_turn_claude_answers_with_an_error_is_reported_failed_with_its_message(
        self, headless: tuple[Deployment, FakeGitHub], machine: Machine
    ) -> None:
        deployment, github = headless
        turn = deployment.start(1)
        (runner,) = deployment.runners

        assert Path(turn.cwd) == runner.state_dir / "worktrees" / session_name(1)
        rows = wait_until(
            lambda: [r for r in deployment.dispatch_rows() if r["status"] == "failed"],
            seconds=DEADLINE,
            what="the headless turn to be reported failed",
            explain=deployment.explain,
        )
        [failed] = rows
        assert failed["result"] == "harness-failed"
        assert failed["detail"].startswith(f"claude: {NOT_LOGGED_IN}")
        listed = deployment.cli("dispatches", "--all").stdout
        assert NOT_LOGGED_IN in listed
        [event] = deployment.events("dispatch.failed")
        assert NOT_LOGGED_IN in event["data"]["detail"]
        replies = wait_until(
            lambda: [
                c for c in github.comments.values() if c.author == APP_LOGIN and "😕" in c.body
            ],
            seconds=DEADLINE,
            what="the 😕 reply on the issue",
        )
        assert [c.body.split("\n")[0] for c in replies] == [
            f"😕 claude turn failed: `{NOT_LOGGED_IN}`"
        ]


class TestTwoRunnersOnOneMachine:
    def test_two_runners_with_default_state_keep_their_own_trees_and_ledgers(
        self,
        relay: Deployment,
        headless: tuple[Deployment, FakeGitHub],
        machine: Machine,
    ) -> None:
        """Runner ``a`` (of one deployment) and runner ``b`` (of another) share one HOME and
        one XDG_STATE_HOME, and both work on issue #1 of the same repository, from the same
        operator checkout."""
        ours, theirs = relay.start(1), headless[0].start(1)
        (a,), (b,) = relay.runners, headless[0].runners
        mine, yours = Path(ours.cwd), Path(theirs.cwd)

        assert a.state_dir != b.state_dir and a.socket != b.socket
        assert mine == machine.workspace / session_name(1)  # a was given a workspace root
        assert yours == b.state_dir / "worktrees" / session_name(1)
        # Both are worktrees of the one operator checkout, each on a branch of its own.
        worktrees = git("worktree", "list", "--porcelain", cwd=machine.checkout)
        assert f"worktree {mine}\n" in worktrees and f"worktree {yours}\n" in worktrees
        branches = {git("symbolic-ref", "--short", "HEAD", cwd=tree) for tree in (mine, yours)}
        assert len(branches) == 2
        assert ours.session_id != theirs.session_id
        # Each ledger holds its own runner's sessions only.
        held_by_a = [Path(s["checkout"]) for s in a.status()["sessions"]]
        assert mine in held_by_a
        assert all(tree.is_relative_to(machine.workspace) for tree in held_by_a)
        held_by_b = [Path(s["checkout"]) for s in b.status()["sessions"]]
        assert all(tree.is_relative_to(b.state_dir) for tree in held_by_b)

    def test_a_second_agent_on_the_same_state_is_refused_in_one_line(
        self, relay: Deployment, machine: Machine
    ) -> None:
        (a,) = relay.runners
        assert a.proc is not None
        again = run_cli(
            *a.run_args("--checkout", f"{REPO}={machine.checkout}"), env=machine.environ()
        )

        assert again.returncode != 0
        lines = again.stderr.strip().splitlines()
        assert len(lines) == 1, again.stderr
        assert lines[0].startswith(f"error: another runner agent (pid {a.proc.pid}) is using ")
        assert str(a.state_dir) in lines[0]
        assert "Traceback" not in again.stderr
        assert a.proc.poll() is None  # the first one runs on
