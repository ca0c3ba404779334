"""Every harness through the same cases, with its real CLI completing real turns offline.

Each CLI (the pinned Claude Code, Codex, Gemini CLI and Copilot CLI) runs under the applier,
with a real ledger and a real git tree, against a loopback stand-in for its model API
(``tests.model_apis``): the stand-in sees the prompts, the CLI prints or draws its real output,
and the harness module reads it. Headless turns run for every one; the hostable ones are also
hosted in real tmux, where a spawn, a pasted comment and a respawn after the harness was killed
must all reach the same conversation. cursor-agent is not on npm; its module runs through the
fake harness (tests/agent/test_apply.py).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

import pytest

from looprelay.agent import harnesses
from looprelay.agent.agent_config import is_agent_config
from looprelay.agent.apply import Applier, ApplyResult
from looprelay.agent.ledger import Ledger
from looprelay.agent.prepare import SessionPreparer
from looprelay.agent.sandbox import Probe, Sandbox
from looprelay.agent.skill import SKILL_NAME
from looprelay.agent.tmux import TmuxTerminal
from looprelay.agent.workspaces import Workspaces
from looprelay.config.model import HOSTABLE_HARNESSES, RoutingConfig
from tests.agent.conftest import SESSION, make_dispatch
from tests.fake_harness import wait_until
from tests.gitrepos import GitRepos, git
from tests.harness_clis import DIALECTS, pointed_at_stand_in
from tests.model_apis import REFUSAL, ModelApi

pytestmark = pytest.mark.real_cli  # run apart from the parallel workers

DEADLINE = 60.0
"""How long a hosted harness may take to send what was pasted; about 2 s when idle."""
TURN_TIMEOUT_SECONDS = 120.0
"""One offline turn takes 1-3 s; this is for a loaded machine."""


@dataclass
class Turns:
    """One harness's applier, the stand-in it talks to and the session's tree."""

    name: str
    applier: Applier
    api: ModelApi
    tree: Path


HOSTED = sorted(name for name in DIALECTS if harnesses.get(name).hostable)


@pytest.fixture(params=sorted(DIALECTS))
def turns(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    git_repos: GitRepos,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Turns]:
    name: str = request.param
    terminal = TmuxTerminal(f"looprelay-test-{uuid.uuid4().hex[:12]}")  # headless: never started
    yield from _turns(name, terminal, tmp_path, git_repos, monkeypatch)


@pytest.fixture(
    params=[(name, False) for name in sorted(DIALECTS)] + [(name, True) for name in HOSTED],
    ids=lambda param: f"{param[0]}-{'hosted' if param[1] else 'headless'}",
)
def sandboxed(
    request: pytest.FixtureRequest,
    bwrap: Probe,
    terminal: TmuxTerminal,
    tmp_path: Path,
    git_repos: GitRepos,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[tuple[Turns, bool]]:
    """A harness whose sessions all run in bubblewrap, and whether it is hosted in tmux."""
    name, hosted = request.param
    sandbox = Sandbox(mode="always", probe=bwrap)
    for turns in _turns(name, terminal, tmp_path, git_repos, monkeypatch, sandbox=sandbox):
        yield turns, hosted


@pytest.fixture(params=HOSTED)
def hosted(
    request: pytest.FixtureRequest,
    terminal: TmuxTerminal,
    tmp_path: Path,
    git_repos: GitRepos,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Turns]:
    # An agent a CI system runs (a GitHub Actions job) has these; a hosted harness must not
    # take them for a sign that nobody is at its terminal.
    monkeypatch.setenv("CI", "true")
    monkeypatch.setenv("GITHUB_ACTIONS", "true")
    yield from _turns(request.param, terminal, tmp_path, git_repos, monkeypatch)


def _turns(
    name: str,
    terminal: TmuxTerminal,
    tmp_path: Path,
    git_repos: GitRepos,
    monkeypatch: pytest.MonkeyPatch,
    *,
    sandbox: Sandbox | None = None,
) -> Iterator[Turns]:
    stack = ExitStack()
    api, args = stack.enter_context(pointed_at_stand_in(name, tmp_path, monkeypatch))
    checkout = git_repos.clone("octo/repo", tmp_path / "checkout")
    ledger = Ledger(tmp_path / "state" / "ledger.db")
    workspaces = Workspaces(
        configured={"octo/repo": checkout}, root=tmp_path / "ws", worktrees=tmp_path / "wt"
    )
    applier = Applier(
        terminal,
        ledger,
        SessionPreparer(workspaces, ledger, {name: args}),
        headless_timeout_seconds=TURN_TIMEOUT_SECONDS,
        spawn_probe_seconds=1.0,
        sandbox=sandbox or Sandbox(),
    )
    yield Turns(name, applier, api, tmp_path / "ws" / SESSION)
    ledger.close()
    stack.close()


class TestHarnessContract:
    def test_a_turn_is_answered_and_the_model_saw_the_prompt(self, turns: Turns) -> None:
        _one_turn_answered(turns)

    def test_a_later_turn_resumes_the_same_conversation(self, turns: Turns) -> None:
        first = turns.applier.apply(
            make_dispatch(runner_kind="process", harness=turns.name, prompt="first prompt")
        )
        second = turns.applier.apply(
            make_dispatch(
                runner_kind="process",
                harness=turns.name,
                kind="deliver",
                seq=2,
                prompt="second prompt",
            )
        )
        assert (second.status, second.resumed) == ("done", True), second.detail
        assert second.session_id == first.session_id
        # Resumed: the request carrying the new prompt replays the first one too.
        with_both = [
            body
            for body in turns.api.bodies
            if b"first prompt" in body and b"second prompt" in body
        ]
        assert with_both, "the second turn's request did not carry the first turn"

    def test_a_failing_model_api_fails_the_turn_with_a_short_reply(self, turns: Turns) -> None:
        turns.api.failing = True
        result = turns.applier.apply(
            make_dispatch(runner_kind="process", harness=turns.name, prompt="first prompt")
        )
        assert (result.status, result.reason) == ("failed", "harness-failed"), result.detail
        assert result.detail.startswith(f"{turns.name}: ")
        assert REFUSAL in result.detail, "the provider's own message is what the operator sees"
        assert result.reply and turns.name in result.reply

    def test_the_skill_is_where_the_harness_reads_it_and_git_stays_clean(
        self, turns: Turns
    ) -> None:
        result = turns.applier.apply(
            make_dispatch(runner_kind="process", harness=turns.name, prompt="first prompt")
        )
        assert result.status == "done", result.detail
        skill = turns.tree.joinpath(*harnesses.get(turns.name).skill_dir, SKILL_NAME)
        assert (skill / "SKILL.md").is_file()
        assert git("status", "--porcelain", cwd=turns.tree) == ""
        assert turns.api.saw(SKILL_NAME), "the harness did not tell its model about the skill"


def _spawned(hosted: Turns) -> ApplyResult:
    """Spawn ``hosted``'s harness in tmux and wait until the stand-in saw its boot prompt."""
    spawned = hosted.applier.apply(make_dispatch(harness=hosted.name, prompt="first prompt"))
    assert spawned.status == "spawned", spawned.detail
    wait_until(
        lambda: hosted.api.saw("first prompt"),
        seconds=DEADLINE,
        what="boot prompt",
        explain=lambda: hosted.applier.terminal.last_lines(SESSION),
    )
    return spawned


def _wait_for_both(hosted: Turns, what: str) -> None:
    """Wait until a request carried the second prompt with the first: one conversation."""
    wait_until(
        lambda: any(b"first prompt" in b and b"second prompt" in b for b in hosted.api.bodies),
        seconds=DEADLINE,
        what=what,
        explain=lambda: hosted.applier.terminal.last_lines(SESSION),
    )


def _spawn_then_paste(hosted: Turns) -> None:
    """Spawn ``hosted``'s harness, then paste a comment: both prompts in one conversation."""
    _spawned(hosted)
    later = make_dispatch(harness=hosted.name, kind="deliver", seq=2, prompt="second prompt")
    delivered = hosted.applier.apply(later)
    assert (delivered.status, delivered.detail) == ("delivered", "pasted")
    _wait_for_both(hosted, "the comment, in the same chat")


def _one_turn_answered(turns: Turns) -> None:
    """A headless turn of ``turns``' harness: answered, the prompt seen, the id kept."""
    result = turns.applier.apply(
        make_dispatch(runner_kind="process", harness=turns.name, prompt="first prompt")
    )
    assert (result.status, result.reason) == ("done", ""), result.detail
    assert result.reply == "Noted."
    assert turns.api.saw("first prompt")
    assert result.session_id, "the conversation's id is kept for the next turn"


class TestSandboxedContract:
    def test_a_session_inside_bubblewrap_is_served(self, sandboxed: tuple[Turns, bool]) -> None:
        # What a fork's session runs in: the CLI must find all it needs (its package, its
        # interpreter, its config) with the rest of the machine hidden.
        turns, hosted = sandboxed
        if hosted:
            _spawn_then_paste(turns)
        else:
            _one_turn_answered(turns)


class TestHostedContract:
    def test_a_spawn_and_a_later_comment_reach_the_same_live_session(self, hosted: Turns) -> None:
        _spawn_then_paste(hosted)

    def test_a_killed_harness_resumes_the_same_conversation(self, hosted: Turns) -> None:
        spawned = _spawned(hosted)
        terminal = hosted.applier.terminal
        terminal.terminate_harness(SESSION, 5.0)
        wait_until(lambda: terminal.pane_dead(SESSION), seconds=DEADLINE, what="the harness gone")
        later = make_dispatch(harness=hosted.name, kind="deliver", seq=2, prompt="second prompt")
        respawned = hosted.applier.apply(later)
        assert (respawned.status, respawned.resumed) == ("spawned", True), respawned.detail
        assert respawned.session_id == spawned.session_id
        _wait_for_both(hosted, "the resumed conversation")


def test_every_hosted_harness_has_a_contract_case() -> None:
    """A harness added to the registry without a real-CLI case here fails this."""
    assert set(harnesses.NAMES) - {"cursor-agent"} == set(DIALECTS)


def test_the_config_offers_exactly_the_registered_harnesses() -> None:
    offered = RoutingConfig.model_fields["harness"].annotation
    assert set(get_args(offered)) == set(harnesses.NAMES)
    hostable = {name for name, harness in harnesses.REGISTRY.items() if harness.hostable}
    assert set(HOSTABLE_HARNESSES) == hostable


def test_an_untrusted_tree_gets_every_harness_config_path_from_the_base() -> None:
    for harness in harnesses.REGISTRY.values():
        for path in (*harness.config_paths, *harness.skill_dir[:1]):
            assert is_agent_config(path), f"{harness.name}: {path}"
        for name in harness.config_names:
            assert is_agent_config(f"deep/down/{name}"), f"{harness.name}: {name}"
