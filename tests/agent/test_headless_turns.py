"""A headless turn end to end: a real agent runs the fake harness (printing Claude 2.x's result
object) and reports over real HTTP to the runner API, on each store, which posts on the fake
GitHub what the turn said."""

from __future__ import annotations

import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from looprelay.agent.apply import Applier
from looprelay.agent.client import RunnerClient
from looprelay.agent.credentials import Credentials
from looprelay.agent.ledger import Ledger
from looprelay.agent.prepare import SessionPreparer
from looprelay.agent.run import Agent, AgentState
from looprelay.agent.session_env import SessionEnv
from looprelay.agent.tmux import TmuxTerminal
from looprelay.agent.workspaces import Workspaces
from looprelay.core.model import DispatchRecord
from looprelay.core.replies import GITHUB_MAX_COMMENT_CHARS, MAX_REPLY_CHARS
from tests.fake_github import REPOSITORY, FakeGitHub
from tests.fake_harness import DEADLINE_SECONDS, FakeHarness, wait_until
from tests.gitrepos import offline_github
from tests.rigs import Stores
from tests.test_leases import Desk, serve_desk

NOT_LOGGED_IN = "Not logged in · Please run /login"


@pytest.fixture
def desk(stores: Stores, fake_github: FakeGitHub) -> Iterator[Desk]:
    yield from serve_desk(stores, fake_github)


@pytest.fixture
def agent(
    desk: Desk, fake_harness: FakeHarness, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Agent]:
    """A registered agent serving the fake GitHub's repository, running in a thread."""
    runner = desk.runner("laptop")
    repos = offline_github(tmp_path / "git", monkeypatch)
    repos.create(REPOSITORY)
    checkout, state = repos.clone(REPOSITORY, tmp_path / "checkout"), tmp_path / "agent"
    state.mkdir()
    ledger = Ledger(state / "ledger.db")
    credentials = Credentials(
        server=desk.url, runner_id=runner.runner_id, secret=runner.secret, name=runner.name
    )
    client = RunnerClient(credentials)
    applier = Applier(
        # Headless turns never touch tmux; the terminal is only the applier's other runner.
        TmuxTerminal(f"looprelay-test-{uuid.uuid4().hex[:12]}"),
        ledger,
        SessionPreparer(
            Workspaces(configured={REPOSITORY: checkout}, root=None, worktrees=state / "worktrees"),
            ledger,
            {},
        ),
        headless_timeout_seconds=DEADLINE_SECONDS,
        session_env=SessionEnv(client),
    )
    running = Agent(
        client=client,
        applier=applier,
        state=AgentState(state / "status.json"),
        describe=lambda: {"capacity": 1, "repositories": [REPOSITORY]},
        capacity=1,
        poll_wait_seconds=0.5,
    )
    thread = threading.Thread(target=running.run, name="agent", daemon=True)
    thread.start()
    yield running
    running.stop.set()
    thread.join(DEADLINE_SECONDS)
    assert not thread.is_alive(), "the agent did not stop"
    ledger.close()


def _settled(desk: Desk, agent: Agent, dispatch: DispatchRecord) -> DispatchRecord:
    """Seed ``dispatch``; return it once the agent's report of it has been answered (the
    server posts on GitHub before it answers)."""
    desk.seed(1, dispatch)
    wait_until(
        lambda: agent.state.counts.get("done", 0) + agent.state.counts.get("failed", 0),
        seconds=2 * DEADLINE_SECONDS,
        what=f"the report of {dispatch.dispatch_id}",
    )
    return desk.stored(dispatch.dispatch_id)


class TestHeadlessTurnsThroughTheAgent:
    def test_a_turn_claude_answers_with_is_error_is_failed_with_its_message(
        self, desk: Desk, agent: Agent, fake_harness: FakeHarness
    ) -> None:
        fake_harness.mark("headless-fail")
        dispatch = _settled(desk, agent, desk.dispatch(1, runner_kind="process"))
        assert (dispatch.status, dispatch.result) == ("failed", "harness-failed")
        assert dispatch.detail.startswith(f"claude: {NOT_LOGGED_IN} (exit 1)")
        [event] = desk.events("dispatch.failed")
        assert event["detail"].startswith(f"claude: {NOT_LOGGED_IN} (exit 1)")
        [reply] = desk.replies(1)
        assert reply.startswith(f"😕 claude turn failed: `{NOT_LOGGED_IN}`\n\n<!-- looprelay:v1")
        assert desk.reactions(dispatch.comment_id or 0) == ["confused"]

    def test_an_answer_longer_than_a_comment_is_cut_and_says_so(
        self, desk: Desk, agent: Agent, fake_harness: FakeHarness
    ) -> None:
        answer = "Fixed.\n" + "é" * 100_000
        fake_harness.answer(answer)
        dispatch = _settled(desk, agent, desk.dispatch(1, runner_kind="process"))
        assert dispatch.status == "succeeded"
        [reply] = desk.replies(1)
        text = reply.split("\n\n<!-- looprelay:v1")[0]
        kept = text.split("\n\n… (cut: ")[0]
        assert len(reply) <= GITHUB_MAX_COMMENT_CHARS and len(text) <= MAX_REPLY_CHARS
        assert answer.startswith(kept) and len(kept) > 60_000
        assert text.endswith(f"… (cut: {len(answer) - len(kept)} more characters)")
        assert desk.reactions(dispatch.comment_id or 0) == ["hooray"]

    def test_a_turn_can_comment_through_looprelay_session_as_the_app(
        self, desk: Desk, agent: Agent, fake_harness: FakeHarness
    ) -> None:
        dispatch = _settled(desk, agent, desk.dispatch(1, runner_kind="process"))
        assert dispatch.status == "succeeded"
        [start] = fake_harness.starts()
        # What the turn's own shell would run, in its tree, with the environment it was given.
        said = subprocess.run(
            ["looprelay", "session", "comment", "--body-file", "-"],
            input="Done: the parser is fixed.",
            cwd=start["cwd"],
            env=start["env"],
            capture_output=True,
            text=True,
            timeout=DEADLINE_SECONDS,
            check=False,
        )
        assert said.returncode == 0, said.stderr
        [comment] = [c for c in desk.attach_comments(1) if "kind=session-comment " in c]
        assert comment.startswith("Done: the parser is fixed.\n\n<!-- looprelay:v1")
