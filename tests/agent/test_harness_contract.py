"""Every harness through the same cases, with its real CLI completing real turns offline.

Each CLI (the pinned Claude Code, Codex, Gemini CLI and Copilot CLI) runs headless under the
applier, with a real ledger and a real git tree, against a loopback stand-in for its model API
(``tests.model_apis``): the stand-in sees the prompts, the CLI prints its real output, and the
harness module reads it. cursor-agent is not on npm; its module runs through the fake harness
(tests/agent/test_apply.py).
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
from looprelay.agent.apply import Applier
from looprelay.agent.ledger import Ledger
from looprelay.agent.prepare import SessionPreparer
from looprelay.agent.skill import SKILL_NAME
from looprelay.agent.tmux import TmuxTerminal
from looprelay.agent.workspaces import Workspaces
from looprelay.config.model import RoutingConfig
from tests.agent.conftest import SESSION, make_dispatch
from tests.claude_cli import fresh_claude_home
from tests.gitrepos import GitRepos, git
from tests.harness_clis import STANDIN_KEY, binary, offline_setup
from tests.model_apis import REFUSAL, ModelApi, gemini_api, messages_api, responses_api

TURN_TIMEOUT_SECONDS = 120.0
"""One offline turn takes 1-3 s; this is for a loaded machine."""
DIALECTS = {"claude": messages_api, "codex": responses_api, "gemini": gemini_api}
DIALECTS["copilot"] = messages_api  # its own-provider mode, set to Anthropic's API


@dataclass
class Turns:
    """One harness's applier, the stand-in it talks to and the session's tree."""

    name: str
    applier: Applier
    api: ModelApi
    tree: Path


@pytest.fixture(params=sorted(DIALECTS))
def turns(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    git_repos: GitRepos,
    monkeypatch: pytest.MonkeyPatch,
) -> Iterator[Turns]:
    name: str = request.param
    api, stack = ModelApi(DIALECTS[name]), ExitStack()
    args = _environment(name, tmp_path, api.url, monkeypatch, stack)
    checkout = git_repos.clone("octo/repo", tmp_path / "checkout")
    ledger = Ledger(tmp_path / "state" / "ledger.db")
    workspaces = Workspaces(
        configured={"octo/repo": checkout}, root=tmp_path / "ws", worktrees=tmp_path / "wt"
    )
    applier = Applier(
        TmuxTerminal(f"looprelay-test-{uuid.uuid4().hex[:12]}"),  # headless: never started
        ledger,
        SessionPreparer(workspaces, ledger, {name: args}),
        headless_timeout_seconds=TURN_TIMEOUT_SECONDS,
    )
    yield Turns(name, applier, api, tmp_path / "ws" / SESSION)
    ledger.close()
    api.close()
    stack.close()


def _environment(
    name: str, tmp_path: Path, api_url: str, monkeypatch: pytest.MonkeyPatch, stack: ExitStack
) -> tuple[str, ...]:
    """Set this process's environment (the harness inherits it) as a runner machine with
    only ``name`` pointed at the stand-in would have it; return its ``--harness-arg`` flags."""
    if name == "claude":
        claude = stack.enter_context(fresh_claude_home(_claude_binary(), tmp_path))
        for unset in claude.unset:
            monkeypatch.delenv(unset, raising=False)
        for key, value in {**claude.env, "ANTHROPIC_BASE_URL": api_url}.items():
            monkeypatch.setenv(key, value)
        monkeypatch.setenv("ANTHROPIC_API_KEY", STANDIN_KEY)
        return ()
    found = binary(name)
    setup = offline_setup(name, home=tmp_path / "home", api_url=api_url)
    for key, value in setup.env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("PATH", f"{found.parent}:{Path('/usr/bin')}:{Path('/bin')}")
    return setup.args


def _claude_binary() -> Path:
    from tests import claude_cli

    found = claude_cli.cached_binary()
    if found is None:
        binary("claude")  # skips, or fails in CI, the same way as the others
        raise AssertionError("unreachable")
    return found


class TestHarnessContract:
    def test_a_turn_is_answered_and_the_model_saw_the_prompt(self, turns: Turns) -> None:
        result = turns.applier.apply(
            make_dispatch(runner_kind="process", harness=turns.name, prompt="first prompt")
        )
        assert (result.status, result.reason) == ("done", ""), result.detail
        assert result.reply == "Noted."
        assert turns.api.saw("first prompt")
        assert result.session_id, "the conversation's id is kept for the next turn"

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


def test_every_hosted_harness_has_a_contract_case() -> None:
    """A harness added to the registry without a real-CLI case here fails this."""
    assert set(harnesses.NAMES) - {"cursor-agent"} == set(DIALECTS)


def test_the_config_offers_exactly_the_registered_harnesses() -> None:
    offered = RoutingConfig.model_fields["harness"].annotation
    assert set(get_args(offered)) == set(harnesses.NAMES)


def test_an_untrusted_tree_gets_every_harness_config_path_from_the_base() -> None:
    for harness in harnesses.REGISTRY.values():
        for path in (*harness.config_paths, *harness.skill_dir[:1]):
            assert is_agent_config(path), f"{harness.name}: {path}"
        for name in harness.config_names:
            assert is_agent_config(f"deep/down/{name}"), f"{harness.name}: {name}"
